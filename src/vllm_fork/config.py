"""Where things live: the names of the repository's files and environment variables,
and how the repository root is found (the loaded workspace: sources/workspace.py)."""

from __future__ import annotations

import os
from pathlib import Path

from vllm_fork.cache import ENV_CACHE, default_cache_dir
from vllm_fork.errors import ConfigError

__all__ = [
    "ENV_CACHE",
    "default_cache_dir",
    "discovered_root",
    "find_root",
    "truthy",
]

ENV_OFFLINE = "VLLM_FORK_OFFLINE"
ENV_ROOT = "VLLM_FORK_ROOT"
BASES_FILE = "bases.toml"
KNOWN_ISSUES_FILE = "known-issues.toml"


def truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in {"1", "true", "yes", "on"}


def discovered_root(start: Path | None = None) -> Path | None:
    """The fork repository the user points at: ``$VLLM_FORK_ROOT``, else the
    nearest directory holding ``bases.toml`` at or above ``start`` (default:
    the current directory); None when neither names one."""
    env_root = os.environ.get(ENV_ROOT)
    if env_root:
        root = Path(env_root).resolve()
        if not (root / BASES_FILE).is_file():
            raise ConfigError(f"{ENV_ROOT}={env_root} has no {BASES_FILE}")
        return root
    here = (start or Path.cwd()).resolve()
    for candidate in (here, *here.parents):
        if (candidate / BASES_FILE).is_file():
            return candidate
    return None


def find_root(start: Path | None = None) -> Path:
    """The fork repository: :func:`discovered_root`, else the checkout this
    package was installed from."""
    found = discovered_root(start)
    if found is not None:
        return found
    source_checkout = Path(__file__).resolve().parents[2]
    if (source_checkout / BASES_FILE).is_file():
        return source_checkout
    here = (start or Path.cwd()).resolve()
    raise ConfigError(
        f"cannot find the fork repository: no {BASES_FILE} in {here} or its parents "
        f"(run inside the repository or set {ENV_ROOT})"
    )


# The torch of the fork's tree venvs (vllm_fork.testing.treevenv) and of a
# precompiled ROCm build's environment. A CPU build is enough (no GPU code
# runs); the one the local wheel mirror holds.
ENV_TORCH = "TREE_TORCH"
DEFAULT_TORCH = "torch==2.13.0"


def torch_spec(given: str | None = None) -> str:
    """The torch requirement for tree venvs: ``given``, else ``$TREE_TORCH``, else the default."""
    return given or os.environ.get(ENV_TORCH) or DEFAULT_TORCH
