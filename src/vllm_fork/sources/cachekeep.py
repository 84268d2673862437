"""`vllm-fork cache`: what the download cache holds, by kind, and what no pinned
base or recent run needs (``cache prune``).

Every path comes from :mod:`vllm_fork.cache` (the one home of the layout). An
entry is one file or directory of a kind; an entry prune may remove carries
the reason. What is removable:

- downloads (``dist/``): a file ``bases.toml`` pins for no base (sdist, upstream
  wheel, ROCm wheel), with its verification record (``state/dist/``);
- build environments and tree venvs: unused for ``unused_days`` (the
  ``.vllm-fork-used`` stamp every command that uses one touches), and a build
  environment whose creation never finished (no ``.vllm-fork-ready``);
- work trees (``work/``): the tree of a run that is gone (the pid it recorded:
  a build tree's marker, an internal tree's git configuration), or one no run
  touched for ``unused_days``;
- backport runs and watch clones: untouched for ``unused_days``;
- matrix rows and probe findings: those of releases ``bases.toml`` no longer
  pins, and the ones a newer file of the same release superseded (their key
  holds the tool's code and the series: only the newest can still be hit);
- release-check state of releases no longer pinned.

Kept always: the upstream git repository (one commit per pinned release), the
lock files (removing one a run is about to open would split the lock), the
records of what is kept, and anything of a kind the layout does not name.
Prune holds the cache lock and the build environments' lock, and each tree
venv's lock while it removes it, so a download, an import or an environment
being made is never cut; the tree of a run still going (its pid alive) is
never removed.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

from vllm_fork.cache import BUILD_ENV_READY, LAST_USED, TREE_PID_KEY, CacheLayout
from vllm_fork.git import run_git
from vllm_fork.lock import MARKER, TMP_PREFIX, alive, cache_lock, dir_lock
from vllm_fork.sources.pins import Pins
from vllm_fork.sources.workspace import Workspace

log = logging.getLogger(__name__)

DAY = 86400.0
UNUSED_DAYS = 14  # the default of --unused-days


@dataclass(frozen=True)
class Kind:
    name: str  # what the report calls it
    where: str  # its path under the cache, as the report shows it


DOWNLOADS = Kind("downloads", "dist/")
UPSTREAM = Kind("upstream git", "upstream.git/")
BUILD_ENVS = Kind("build environments", "build-env/")
TREE_VENVS = Kind("tree venvs", "tree-venvs/")
WORK = Kind("work trees", "work/")
RELEASE_CHECK = Kind("release-check state", "release-check/")
BACKPORT = Kind("backport runs", "backport/")
WATCH = Kind("watch clones", "watch/")
MATRIX = Kind("matrix rows", "matrix/")
PROBES = Kind("probe findings", "probes/")
RECORDS = Kind("records", "state/")
LOCKS = Kind("locks", "locks/, .lock")
STAGING = Kind("staging", "tmp/")
OTHER = Kind("other", "(not the tool's)")
KINDS = (
    DOWNLOADS,
    UPSTREAM,
    BUILD_ENVS,
    TREE_VENVS,
    WORK,
    RELEASE_CHECK,
    BACKPORT,
    WATCH,
    MATRIX,
    PROBES,
    RECORDS,
    LOCKS,
    STAGING,
    OTHER,
)


@dataclass(frozen=True)
class Entry:
    kind: Kind
    path: Path
    size: int  # bytes on disk
    why: str | None = None  # why prune removes it (None: kept)


@dataclass
class Survey:
    root: Path
    entries: list[Entry] = field(default_factory=list)

    def of(self, kind: Kind) -> list[Entry]:
        return [e for e in self.entries if e.kind == kind]

    @property
    def size(self) -> int:
        return sum(e.size for e in self.entries)

    @property
    def prunable(self) -> list[Entry]:
        return [e for e in self.entries if e.why is not None]

    def to_json(self) -> dict[str, object]:
        return {
            "cache": str(self.root),
            "size": self.size,
            "prunable": sum(e.size for e in self.prunable),
            "kinds": [
                {
                    "kind": k.name,
                    "where": k.where,
                    "entries": len(self.of(k)),
                    "size": sum(e.size for e in self.of(k)),
                    "prunable": sum(e.size for e in self.of(k) if e.why),
                }
                for k in KINDS
            ],
            "prune": [{"path": str(e.path), "size": e.size, "why": e.why} for e in self.prunable],
        }


def disk_size(path: Path) -> int:
    """Bytes ``path`` takes on disk (du's count: blocks, each inode once, no
    symbolic link followed)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    stack = [path]
    while stack:
        current = stack.pop()
        try:
            st = current.lstat()
        except OSError:
            continue
        if (st.st_dev, st.st_ino) in seen:
            continue
        seen.add((st.st_dev, st.st_ino))
        total += st.st_blocks * 512
        if current.is_dir() and not current.is_symlink():
            try:
                stack.extend(current.iterdir())
            except OSError:
                continue
    return total


def human(size: int) -> str:
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"  # pragma: no cover


def _children(directory: Path) -> Iterator[Path]:
    if directory.is_dir():
        yield from sorted(directory.iterdir())


def _mtime(*paths: Path) -> float | None:
    """The newest modification time among ``paths`` that exist."""
    times = []
    for path in paths:
        try:
            times.append(path.lstat().st_mtime)
        except OSError:
            continue
    return max(times) if times else None


def _idle(stamp: float | None, now: float, days: float) -> str | None:
    """ "unused for N days" when ``stamp`` is older than ``days`` (None: recent)."""
    if stamp is None or now - stamp < days * DAY:
        return None
    return f"unused for {int((now - stamp) // DAY)} days"


def pinned_files(pins: Pins) -> set[str]:
    """The file names bases.toml pins: every base's sdist, upstream wheel and ROCm wheels."""
    names = set()
    for base in pins.bases.values():
        names.add(base.sdist.filename)
        if base.wheel is not None:
            names.add(base.wheel.filename)
        names.update(pin.filename for pin in base.rocm)
    return names


def _owner_pid(entry: Path) -> int | None:
    """The pid of the run that made a work-area entry: a marked directory's
    marker, else an internal tree's git configuration (None: not recorded)."""
    marker = entry / MARKER
    if marker.is_file():
        try:
            return int(marker.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None
    if (entry / ".git").exists():
        got = run_git(["config", "--get", TREE_PID_KEY], cwd=entry, check=False)
        if got.returncode == 0:
            try:
                return int(got.stdout.decode().strip())
            except ValueError:
                return None
    return None


def _work_why(entry: Path, now: float, days: float) -> str | None:
    pid = _owner_pid(entry) if entry.is_dir() and not entry.is_symlink() else None
    if pid is not None:
        return None if alive(pid) else f"the run that made it (pid {pid}) is gone"
    if entry.name.startswith(TMP_PREFIX):
        return None  # a marked entry without its marker yet: being made
    return _idle(_mtime(entry), now, days)


def _keyed(directory: Path, pinned: set[str]) -> Iterator[tuple[Path, str | None]]:
    """``<V>-<key>.json`` files: those of releases not pinned, and all but the
    newest of each release, with why."""
    newest: dict[str, tuple[float, Path]] = {}
    files = [p for p in _children(directory) if p.suffix == ".json"]
    for path in files:
        version = path.name.rsplit("-", 1)[0]
        stamp = _mtime(path) or 0.0
        if version in pinned and (version not in newest or stamp > newest[version][0]):
            newest[version] = (stamp, path)
    for path in _children(directory):
        version = path.name.rsplit("-", 1)[0]
        if path.suffix != ".json":
            yield path, None
        elif version not in pinned:
            yield path, f"{version} is not pinned in bases.toml"
        elif newest[version][1] != path:
            yield path, f"superseded by {newest[version][1].name}"
        else:
            yield path, None


def survey(
    config: Workspace, *, unused_days: float = UNUSED_DAYS, now: float | None = None
) -> Survey:
    """Every entry of the cache by kind, with what prune would remove and why."""
    now = time.time() if now is None else now
    layout: CacheLayout = config.cache
    out = Survey(config.cache_dir)
    if not layout.root.is_dir():
        return out
    pins = config.pins
    versions = set(pins.versions())
    files = pinned_files(pins)

    def add(kind: Kind, path: Path, why: str | None = None) -> None:
        out.entries.append(Entry(kind, path, disk_size(path), why))

    for path in _children(layout.downloads):
        add(DOWNLOADS, path, None if path.name in files else "pinned for no base in bases.toml")
    if layout.upstream_git.exists():
        add(UPSTREAM, layout.upstream_git)
    for path in _children(layout.build_envs):
        if path.name in (".lock", "tmp"):
            add(LOCKS if path.name == ".lock" else STAGING, path)
        elif path.is_dir() and not (path / BUILD_ENV_READY).is_file():
            add(BUILD_ENVS, path, "its creation never finished")
        else:
            add(
                BUILD_ENVS,
                path,
                _idle(_mtime(path / LAST_USED, path / BUILD_ENV_READY), now, unused_days),
            )
    for path in _children(layout.tree_venvs):
        add(TREE_VENVS, path, _idle(_mtime(path / LAST_USED, path), now, unused_days))
    for path in _children(layout.work):
        add(WORK, path, _work_why(path, now, unused_days))
    for path in _children(layout.release_check):
        version = path.name.removesuffix(".json")
        stale = path.suffix == ".json" and version not in versions
        add(RELEASE_CHECK, path, f"{version} is not pinned in bases.toml" if stale else None)
    for path in _children(layout.backport_runs):
        add(BACKPORT, path, _idle(_mtime(path, path / "state.json"), now, unused_days))
    for path in _children(layout.watch_clones):
        add(WATCH, path, _idle(_mtime(path, path / "FETCH_HEAD"), now, unused_days))
    for path, why in _keyed(layout.matrix_rows, versions):
        add(MATRIX, path, why)
    for path, why in _keyed(layout.probes, versions):
        add(PROBES, path, why)
    downloaded = {p.name for p in _children(layout.downloads)}
    for path in _children(layout.records):
        if path == layout.download_records:
            for record in _children(path):
                name = record.name.removesuffix(".sha256")
                gone = name not in downloaded or name not in files
                add(RECORDS, record, "the record of a download prune removes" if gone else None)
        else:
            add(RECORDS, path)
    for path in (layout.lock, layout.locks):
        if path.exists():
            add(LOCKS, path)
    if layout.tmp.exists():
        add(STAGING, layout.tmp)
    named = {
        layout.downloads, layout.upstream_git, layout.build_envs, layout.tree_venvs,
        layout.work, layout.release_check, layout.backport_runs, layout.watch_clones,
        layout.matrix_rows, layout.probes, layout.records, layout.locks, layout.lock, layout.tmp,
    }  # fmt: skip
    for path in _children(layout.root):
        if path not in named:
            add(OTHER, path)
    return out


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


@dataclass
class Pruned:
    before: Survey
    removed: list[Entry]
    after: Survey | None  # None: a dry run

    @property
    def freed(self) -> int:
        return sum(e.size for e in self.removed)


def prune(
    config: Workspace,
    *,
    unused_days: float = UNUSED_DAYS,
    dry_run: bool = False,
) -> Pruned:
    """Remove what :func:`survey` marks (``dry_run``: only say what), holding the
    cache lock and the build environments' lock; each removal is logged."""
    layout = config.cache
    with ExitStack() as held:
        held.enter_context(cache_lock(config.cache_dir))
        held.enter_context(cache_lock(layout.build_envs))
        before = survey(config, unused_days=unused_days)
        if dry_run:
            return Pruned(before, before.prunable, None)
        removed = []
        for entry in before.prunable:
            if entry.kind == WORK and _work_why(entry.path, time.time(), unused_days) is None:
                continue  # a run took it up meanwhile
            if entry.kind == TREE_VENVS:
                with dir_lock(config.cache_dir, entry.path):
                    _remove(entry.path)
            else:
                _remove(entry.path)
            log.info("removed %s (%s): %s", entry.path, human(entry.size), entry.why)
            removed.append(entry)
        after = survey(config, unused_days=unused_days)
    return Pruned(before, removed, after)


def format_survey(s: Survey) -> str:
    rows = [("kind", "where", "entries", "size", "prunable")]
    for kind in KINDS:
        entries = s.of(kind)
        if not entries and kind in (OTHER, STAGING):
            continue
        prunable = sum(e.size for e in entries if e.why)
        rows.append(
            (
                kind.name,
                kind.where,
                str(len(entries)),
                human(sum(e.size for e in entries)),
                human(prunable) if any(e.why for e in entries) else "-",
            )
        )
    total = sum(e.size for e in s.prunable)
    rows.append(("total", "", str(len(s.entries)), human(s.size), human(total)))
    widths = [max(len(r[c]) for r in rows) for c in range(5)]
    lines = [f"cache {s.root}"]
    for n, row in enumerate(rows):
        cells = [
            f"{cell:<{widths[c]}}" if c < 2 else f"{cell:>{widths[c]}}"
            for c, cell in enumerate(row)
        ]
        lines.append("  ".join(cells).rstrip())
        if n == 0 or n == len(rows) - 2:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def format_pruned(p: Pruned) -> str:
    verb = "would remove" if p.after is None else "removed"
    root = p.before.root
    lines = [f"{verb} {e.path.relative_to(root)} ({human(e.size)}): {e.why}" for e in p.removed]
    if p.after is None:
        lines.append(
            f"would free {human(p.freed)} of {human(p.before.size)} "
            f"({len(p.removed)} entries); run `vllm-fork cache prune` to remove them"
        )
    else:
        lines.append(
            f"freed {human(p.freed)} ({len(p.removed)} entries); the cache {root} now holds "
            f"{human(p.after.size)} (was {human(p.before.size)})"
        )
    return "\n".join(lines)


def survey_json(s: Survey) -> str:
    return json.dumps(s.to_json(), indent=2)


__all__ = [
    "KINDS",
    "Entry",
    "Pruned",
    "Survey",
    "format_pruned",
    "format_survey",
    "prune",
    "survey",
]
