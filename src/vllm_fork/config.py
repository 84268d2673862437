"""Where things live: the repository root, the series, the download cache."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from vllm_fork.cache import ENV_CACHE, CacheLayout, default_cache_dir
from vllm_fork.errors import ConfigError

__all__ = [
    "ENV_CACHE",
    "Config",
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


@dataclass(frozen=True)
class Config:
    root: Path
    cache_dir: Path
    offline: bool = False

    @property
    def bases_file(self) -> Path:
        return self.root / BASES_FILE

    @property
    def known_issues_file(self) -> Path:
        return self.root / KNOWN_ISSUES_FILE

    @property
    def series_root(self) -> Path:
        return self.root / "series"

    def series_dir(self, version: str) -> Path:
        return self.series_root / version

    @property
    def cache(self) -> CacheLayout:
        return CacheLayout(self.cache_dir)

    @property
    def dist_dir(self) -> Path:
        return self.cache.downloads

    @property
    def tmp_dir(self) -> Path:
        return self.cache.tmp

    @property
    def upstream_repo(self) -> Path:
        return self.cache.upstream_git
