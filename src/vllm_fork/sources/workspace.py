"""The workspace of one command: configuration, pins, series and fetcher, loaded once.

The command line makes one :class:`Workspace` per command
(:func:`load_config`) and passes it down. Each input is read
on first use and kept for the rest of the command: ``bases.toml`` is parsed
once, each series is read (one ``git interpret-trailers`` per patch) once, and
every download and index look-up goes through the one :class:`Fetcher`, which
remembers the index pages it has read. The paths of the cache come from
:mod:`vllm_fork.cache` (``workspace.cache``).

A loaded file is kept with the ``stat`` of what it was read from (name, size,
mtime, inode): when ``bases.toml`` or a series directory is rewritten (``pin``,
``rebase``, or a caller that keeps one workspace across commands) the next use
reads it again, so a workspace never serves stale pins or patches.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vllm_fork.cache import CacheLayout
from vllm_fork.config import (
    BASES_FILE,
    ENV_OFFLINE,
    ENV_ROOT,
    KNOWN_ISSUES_FILE,
    default_cache_dir,
    discovered_root,
    find_root,
    truthy,
)
from vllm_fork.errors import ConfigError, UsageError
from vllm_fork.facts import registry
from vllm_fork.facts.known_issues import load_register
from vllm_fork.series.patches import load_series
from vllm_fork.series.store import stamp_paths as series_stamp_paths
from vllm_fork.sources.fetch import Fetcher
from vllm_fork.sources.pins import load_pins

if TYPE_CHECKING:
    from vllm_fork.facts.known_issues import KnownIssue
    from vllm_fork.series.patches import Series
    from vllm_fork.sources.fetch import Fetcher
    from vllm_fork.sources.pins import Base, Pins

log = logging.getLogger(__name__)

Stamp = tuple[tuple[str, int, int, int] | tuple[str], ...]


def stamp(paths: list[Path]) -> Stamp:
    """What identifies the current content of ``paths`` without reading them."""
    out: list[tuple[str, int, int, int] | tuple[str]] = []
    for path in paths:
        try:
            st = path.stat()
        except FileNotFoundError:
            out.append((path.name,))
            continue
        out.append((path.name, st.st_size, st.st_mtime_ns, st.st_ino))
    return tuple(out)


@dataclass(frozen=True)
class Workspace:
    """The one configuration of a command: where the repository and the cache are,
    whether the network may be used, and what it loads from them (memoized per
    instance)."""

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

    @cached_property
    def _loaded(self) -> dict[Any, tuple[Stamp, Any]]:
        return {}

    @property
    def pins(self) -> Pins:
        """``bases.toml``, parsed once (again only after the file changed)."""
        now = stamp([self.bases_file])
        held = self._loaded.get("pins")
        if held is None or held[0] != now:
            log.debug(f"loading {self.bases_file}")
            held = self._loaded["pins"] = (now, load_pins(self.bases_file))
        return held[1]

    @property
    def known_issues(self) -> tuple[KnownIssue, ...]:
        """``known-issues.toml``, parsed once (again only after the file changed)."""
        now = stamp([self.known_issues_file])
        held = self._loaded.get("known_issues")
        if held is None or held[0] != now:
            log.debug(f"loading {self.known_issues_file}")
            held = self._loaded["known_issues"] = (
                now,
                load_register(self.known_issues_file, registry.change_ids()),
            )
        return held[1]

    def base(self, version: str | None = None) -> Base:
        """A pinned base (``None``: the default base)."""
        return self.pins.get(version)

    def series(self, version: str, *, validate: bool = True) -> Series:
        """The series of ``version`` (series/store.py), read once (again only
        after a file of it changed)."""
        directory = self.series_dir(version)
        key = ("series", version, validate)
        now = stamp(series_stamp_paths(self.series_root, version))
        held = self._loaded.get(key)
        if held is None or held[0] != now:
            log.debug(f"reading {directory}")
            held = self._loaded[key] = (now, load_series(directory, validate=validate))
        return held[1]

    @cached_property
    def fetcher(self) -> Fetcher:
        return Fetcher(self)


def load_config(
    *, offline: bool = False, root: Path | None = None, cache_dir: Path | None = None
) -> Workspace:
    """The workspace of one command: the configuration, with pins, series and the
    fetcher loaded on first use. ``offline`` is also switched on by
    ``$VLLM_FORK_OFFLINE``."""
    return Workspace(
        root=root.resolve() if root else find_root(),
        cache_dir=cache_dir.resolve() if cache_dir else default_cache_dir(),
        offline=offline or truthy(os.environ.get(ENV_OFFLINE)),
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
