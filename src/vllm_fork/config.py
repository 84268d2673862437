"""Where things live: the repository root, the series, the download cache."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from vllm_fork.cache import ENV_CACHE, CacheLayout, default_cache_dir
from vllm_fork.errors import ConfigError, UsageError

if TYPE_CHECKING:
    from vllm_fork.sources.workspace import Workspace

__all__ = [
    "ENV_CACHE",
    "Config",
    "default_cache_dir",
    "discovered_root",
    "find_root",
    "load_config",
    "recorded_workspace",
]

ENV_OFFLINE = "VLLM_FORK_OFFLINE"
ENV_ROOT = "VLLM_FORK_ROOT"
BASES_FILE = "bases.toml"
KNOWN_ISSUES_FILE = "known-issues.toml"


def _truthy(value: str | None) -> bool:
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


def load_config(
    *, offline: bool = False, root: Path | None = None, cache_dir: Path | None = None
) -> Workspace:
    """The workspace of one command: the configuration, with pins, series and the
    fetcher loaded on first use. ``offline`` is also switched on by
    ``$VLLM_FORK_OFFLINE``."""
    from vllm_fork.sources.workspace import Workspace

    return Workspace(
        root=root.resolve() if root else find_root(),
        cache_dir=cache_dir.resolve() if cache_dir else default_cache_dir(),
        offline=offline or _truthy(os.environ.get(ENV_OFFLINE)),
    )


def recorded_workspace(config: Workspace, recorded: Path | None, what: str) -> Workspace:
    """The workspace whose series an operation writes: the repository it
    started from (``recorded``, kept in the work tree or the rebase state).

    When the user's current checkout (``$VLLM_FORK_ROOT`` or the directory
    they are in) is another fork repository the operation is refused: writing
    either would surprise. When they are in no repository at all (the tool
    fell back to the checkout it is installed from) the recorded one is used.
    ``what`` names the record in the messages.
    """
    if recorded is None:
        return config
    recorded = recorded.resolve()
    if recorded == config.root:
        return config
    current = discovered_root()
    if current is not None and current == config.root:
        raise UsageError(
            f"{what} started from the fork repository {recorded}, but this command runs in "
            f"{config.root}; run it from {recorded} (or set {ENV_ROOT}={recorded}) so that "
            "its series are written there"
        )
    if not (recorded / BASES_FILE).is_file():
        raise ConfigError(
            f"{what} started from the fork repository {recorded}, which has no {BASES_FILE} "
            f"any more; set {ENV_ROOT} to the repository whose series it should write"
        )
    return load_config(offline=config.offline, root=recorded, cache_dir=config.cache_dir)
