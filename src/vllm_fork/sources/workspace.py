"""The workspace of one command: configuration, pins, series and fetcher, loaded once.

The command line makes one :class:`Workspace` per command
(:func:`vllm_fork.config.load_config`) and passes it down. Each input is read
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
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vllm_fork.config import Config
from vllm_fork.series.store import stamp_paths as series_stamp_paths

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
class Workspace(Config):
    """A :class:`Config` that also holds what it loads (memoized per instance)."""

    @cached_property
    def _loaded(self) -> dict[Any, tuple[Stamp, Any]]:
        return {}

    @property
    def pins(self) -> Pins:
        """``bases.toml``, parsed once (again only after the file changed)."""
        from vllm_fork.sources.pins import load_pins

        now = stamp([self.bases_file])
        held = self._loaded.get("pins")
        if held is None or held[0] != now:
            log.debug(f"loading {self.bases_file}")
            held = self._loaded["pins"] = (now, load_pins(self.bases_file))
        return held[1]

    @property
    def known_issues(self) -> tuple[KnownIssue, ...]:
        """``known-issues.toml``, parsed once (again only after the file changed)."""
        from vllm_fork.facts import registry
        from vllm_fork.facts.known_issues import load_register

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
        from vllm_fork.series.patches import load_series

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
        from vllm_fork.sources.fetch import Fetcher

        return Fetcher(self)
