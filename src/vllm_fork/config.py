"""Where things live: the repository root, the series, the download cache."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from vllm_fork.cache import ENV_CACHE, CacheLayout, default_cache_dir
from vllm_fork.errors import ConfigError

if TYPE_CHECKING:
    from vllm_fork.workspace import Workspace

__all__ = ["ENV_CACHE", "Config", "default_cache_dir", "find_root", "load_config"]

ENV_OFFLINE = "VLLM_FORK_OFFLINE"
ENV_ROOT = "VLLM_FORK_ROOT"
BASES_FILE = "bases.toml"
KNOWN_ISSUES_FILE = "known-issues.toml"


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in {"1", "true", "yes", "on"}


def find_root(start: Path | None = None) -> Path:
    """The fork repository: ``$VLLM_FORK_ROOT``, else the nearest directory
    holding ``bases.toml`` at or above ``start`` (default: the current
    directory), else the checkout this package was installed from."""
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
    source_checkout = Path(__file__).resolve().parents[2]
    if (source_checkout / BASES_FILE).is_file():
        return source_checkout
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


def load_config(
    *, offline: bool = False, root: Path | None = None, cache_dir: Path | None = None
) -> Workspace:
    """The workspace of one command: the configuration, with pins, series and the
    fetcher loaded on first use. ``offline`` is also switched on by
    ``$VLLM_FORK_OFFLINE``."""
    from vllm_fork.workspace import Workspace

    return Workspace(
        root=root.resolve() if root else find_root(),
        cache_dir=cache_dir.resolve() if cache_dir else default_cache_dir(),
        offline=offline or _truthy(os.environ.get(ENV_OFFLINE)),
    )
