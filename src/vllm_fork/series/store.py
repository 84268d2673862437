"""The series store: plain ``git format-patch`` files, each distinct one stored once.

Layout (docs/series-format.md)::

    series/pool/<stem>.<h>.patch  a patch, byte for byte what ``git format-patch``
                                  wrote (``h``: the first 10 hex digits of the
                                  sha256 of those bytes); one file per distinct
                                  content, whatever number of bases carry it
    series/<V>/series             base V's series: its '#' lines (the rebase
                                  history), then the pool files it applies, in order
    series/<V>/revision           optional (series/forkversion.py)

A base's patch ``i`` (from 1) is ``<i:04d>-<stem>.patch``: the name ``git
format-patch`` gives it, so a materialized and unchanged tree exports the same
names and bytes.

This module is the one reader and the one writer of the layout. A store that
still holds files of an older layout (``series/index``, line deltas, per-base
patch directories) is refused with the command that converts it: only
series/legacy.py reads those, for ``vllm-fork series-store``.

Writing (:func:`write_store`) puts new pool files first (each by rename), then
each base's series file (each by rename: a base's commit point), and only then
removes what no series names any more. A run killed or failing at any point
leaves every base's series readable, old or new, with every pool file it names.
"""

from __future__ import annotations

import atexit
import hashlib
import logging
import re
import shutil
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from packaging.version import InvalidVersion, Version

from vllm_fork import faults
from vllm_fork.atomic import place_dir, write_bytes_atomic
from vllm_fork.errors import SeriesError, fs_fault, is_fs_fault

log = logging.getLogger(__name__)

SERIES_FILE = "series"
POOL_DIR = "pool"
PATCH = ".patch"
HASH_LEN = 10
HEADER = (
    "# This base's patches, applied in this order: files of series/pool/ (docs/series-format.md).\n"
    "# Written by `vllm-fork export`; the other '#' lines are the base's rebase history.\n"
)
_HEADER_LINES = frozenset(HEADER.splitlines())
CONVERT = "run `vllm-fork series-store` to convert it (docs/series-format.md)"
MARKERS = ("<<<<<<<", "|||||||", "=======", ">>>>>>>")  # of a merge conflict
_NAME_RE = re.compile(r"^[0-9]{4}-(?P<stem>.+)\.patch$")
_POOL_RE = re.compile(rf"^(?P<stem>[^/\s]+)\.(?P<hash>[0-9a-f]{{{HASH_LEN}}})\.patch$")


@dataclass
class BaseSeries:
    """One base's series: patch stems and bytes in order, and its comment lines."""

    stems: list[str] = field(default_factory=list)
    contents: list[bytes] = field(default_factory=list)
    comments: list[str] = field(default_factory=list)  # each a '#' line, no newline

    @property
    def names(self) -> list[str]:
        return [patch_name(i, stem) for i, stem in enumerate(self.stems, 1)]

    @property
    def pool_names(self) -> list[str]:
        return [pool_name(s, d) for s, d in zip(self.stems, self.contents, strict=True)]

    def key(self) -> tuple[object, ...]:
        return (tuple(self.comments), tuple(self.stems), tuple(self.contents))


def patch_name(position: int, stem: str) -> str:
    """The file name ``git format-patch`` gives patch ``position`` (from 1)."""
    return f"{position:04d}-{stem}.patch"


def stem_of(name: str) -> str:
    m = _NAME_RE.match(name)
    if m:
        return m.group("stem")
    return name[: -len(PATCH)] if name.endswith(PATCH) else name


def content_hash(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def pool_name(stem: str, data: bytes) -> str:
    """The file name of ``data`` in series/pool/."""
    return f"{stem}.{content_hash(data)[:HASH_LEN]}{PATCH}"


def pool_stem(name: str) -> str | None:
    """The stem of a pool file name (None: not one)."""
    m = _POOL_RE.match(name)
    return m.group("stem") if m else None


def _version_key(version: str) -> tuple[int, Version | str]:
    try:
        return (0, Version(version))
    except InvalidVersion:
        return (1, version)


def sort_versions(versions: Iterable[str]) -> list[str]:
    return sorted(versions, key=_version_key)


# --- reading ----------------------------------------------------------------------------


def parse_series(text: str, where: str) -> tuple[list[str], list[str]]:
    """A series file's pool file names, in order, and its '#' lines (the header
    the writer puts first left out)."""
    names: list[str] = []
    comments: list[str] = []
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or raw in _HEADER_LINES:
            continue
        if line.startswith("#"):
            comments.append(raw)
        elif line.startswith(MARKERS):
            raise SeriesError(
                f"{where}:{lineno}: a merge conflict: keep the lines the series needs, delete "
                "the markers, then run `vllm-fork series-store` (docs/series-format.md)"
            )
        elif pool_stem(line) is None:
            raise SeriesError(
                f"{where}:{lineno}: {line!r} is not a file name of series/{POOL_DIR}/ "
                f"(<stem>.<{HASH_LEN} hex digits>{PATCH}; a series of an older layout? {CONVERT})"
            )
        elif line in names:
            raise SeriesError(f"{where}:{lineno}: {line} is listed twice")
        else:
            names.append(line)
    return names, comments


def render_series(base: BaseSeries) -> bytes:
    """The series file of ``base``, as the writer writes it."""
    out = [HEADER, *(f"{line}\n" for line in base.comments)]
    out.extend(f"{name}\n" for name in base.pool_names)
    return "".join(out).encode()


def old_layout(root: Path) -> list[str]:
    """The files under ``root`` (series/) that are not of this layout, relative:
    files of an older one (merged in from a branch that still writes it)."""
    if not root.is_dir():
        return []
    found: list[str] = []
    for entry in sorted(root.iterdir()):
        if entry.name.startswith("."):
            continue
        if not entry.is_dir():
            found.append(entry.name)
        elif entry.name == POOL_DIR:
            found.extend(
                f"{POOL_DIR}/{p.name}"
                for p in sorted(entry.iterdir())
                if not p.name.startswith(".") and pool_stem(p.name) is None
            )
        else:
            found.extend(f"{entry.name}/{p.name}" for p in sorted(entry.glob("*" + PATCH)))
    return found


def check_layout(root: Path) -> None:
    """Refuse a store that holds files of an older layout (they would be ignored)."""
    found = old_layout(root)
    if found:
        more = f" and {len(found) - 3} more" if len(found) > 3 else ""
        raise SeriesError(
            f"{root} holds files of an older series layout ({', '.join(found[:3])}{more}); "
            + CONVERT
        )


class Pool:
    """The files of series/pool/, read once each and checked against their names."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._cache: dict[str, bytes] = {}

    def get(self, name: str, where: str) -> bytes:
        held = self._cache.get(name)
        if held is not None:
            return held
        path = self.directory / name
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise SeriesError(
                f"{where} names {name}, which is not in series/{POOL_DIR}/ (removed by a merge? "
                f"take it from the side that has it: `git checkout <commit> -- "
                f"series/{POOL_DIR}/{name}`)"
            ) from None
        except OSError as exc:
            raise SeriesError(f"cannot read {path}: {exc}") from exc
        if pool_name(pool_stem(name) or "", data) != name:
            raise SeriesError(
                f"series/{POOL_DIR}/{name}: content does not match its name (edited by hand? "
                "a patch changes through `vllm-fork materialize` and `export`; "
                "docs/series-format.md)"
            )
        self._cache[name] = data
        return data


def read_series(root: Path, version: str, pool: Pool) -> BaseSeries | None:
    """``version``'s series file, its patches read from ``pool`` (None: it has none)."""
    path = root / version / SERIES_FILE
    where = f"series/{version}/{SERIES_FILE}"
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise SeriesError(f"cannot read {path}: {exc}") from exc
    names, comments = parse_series(text, where)
    stems = [pool_stem(n) or "" for n in names]
    return BaseSeries(stems, [pool.get(n, where) for n in names], comments)


def _dirs(root: Path) -> list[str]:
    """The base directories under ``root`` (with a series file or not)."""
    if not root.is_dir():
        return []
    return sort_versions(p.name for p in root.iterdir() if p.is_dir() and p.name != POOL_DIR)


def _versions(root: Path) -> list[str]:
    return [v for v in _dirs(root) if (root / v / SERIES_FILE).is_file()]


def versions(root: Path) -> list[str]:
    """Every base with a series, oldest first (``root``: the series/ directory)."""
    check_layout(root)
    return _versions(root)


def has_series(root: Path, version: str) -> bool:
    check_layout(root)
    return version != POOL_DIR and (root / version / SERIES_FILE).is_file()


def read_base(root: Path, version: str) -> BaseSeries | None:
    """``version``'s series (None: it has none)."""
    check_layout(root)
    if version == POOL_DIR:
        return None
    return read_series(root, version, Pool(root / POOL_DIR))


def read_all(root: Path) -> dict[str, BaseSeries]:
    """Every base's series, oldest base first."""
    check_layout(root)
    pool = Pool(root / POOL_DIR)
    out: dict[str, BaseSeries] = {}
    for version in _versions(root):
        base = read_series(root, version, pool)
        if base is not None:
            out[version] = base
    return out


def stamp_paths(root: Path, version: str) -> list[Path]:
    """The paths whose change may change ``version``'s series (for memoizing)."""
    return [root, root / POOL_DIR, root / version, root / version / SERIES_FILE]


def content_digest(comments: Iterable[str], patches: Iterable[tuple[str, bytes]]) -> str:
    """The one hash of a series' content: sha256 over its comment lines, then each
    (name, bytes) in order as name, length and bytes. :func:`digest` and the series
    digest of release-check and provenance (series/patches.py) are this."""
    h = hashlib.sha256()
    for line in comments:
        h.update(f"#\0{line}\0".encode())
    for name, data in patches:
        h.update(f"{name}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()


def digest(base: BaseSeries) -> str:
    """sha256 over a series as it is applied: names, bytes and comment lines."""
    return content_digest(base.comments, zip(base.names, base.contents, strict=True))


# --- expanded copies for readers that need files ----------------------------------------

_EXPANDED: list[Path] = []


def _expand_root() -> Path:
    if not _EXPANDED:
        path = Path(tempfile.mkdtemp(prefix="vllm-fork-series-"))
        _EXPANDED.append(path)
        atexit.register(shutil.rmtree, path, True)
    return _EXPANDED[0]


def expand(base: BaseSeries) -> tuple[Path, list[Path]]:
    """A private directory holding ``base``'s patches under their series names
    (``0001-<stem>.patch``, for ``git am`` and the header readers); made once
    per content in this process."""
    directory = _expand_root() / digest(base)[:32]
    paths = [directory / name for name in base.names]
    if directory.is_dir():
        # made earlier in this process: a reader that wrote to one of its files
        # must not change what the next reader of the same series gets
        for path, data in zip(paths, base.contents, strict=True):
            try:
                same = path.read_bytes() == data
            except OSError:
                same = False
            if not same:
                log.warning(f"{path} no longer held its patch; written again")
                write_bytes_atomic(path, data)
    else:
        tmp = Path(tempfile.mkdtemp(dir=directory.parent, prefix=".part-"))
        for name, data in zip(base.names, base.contents, strict=True):
            (tmp / name).write_bytes(data)
        try:
            place_dir(tmp, directory)
        except OSError:  # made meanwhile
            shutil.rmtree(tmp, ignore_errors=True)
    return directory, paths


# --- writing ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Unresolved:
    """A base's series file as a merge left it, with conflict markers for a
    person to resolve, and the pool files either side names."""

    text: bytes
    patches: Mapping[str, bytes]


def plan(
    bases: Mapping[str, BaseSeries], unresolved: Mapping[str, Unresolved] | None = None
) -> tuple[dict[str, bytes], dict[str, bytes]]:
    """(pool file name -> bytes, base -> series file bytes) for ``bases``; a base
    with neither patches nor '#' lines has no series file."""
    pool: dict[str, bytes] = {}
    lists: dict[str, bytes] = {}
    for version in sort_versions(bases):
        base = bases[version]
        if not (base.stems or base.comments):
            continue
        for stem, data in zip(base.stems, base.contents, strict=True):
            pool.setdefault(pool_name(stem, data), data)
        lists[version] = render_series(base)
    for version, held in (unresolved or {}).items():
        pool.update(held.patches)
        lists[version] = held.text
    return dict(sorted(pool.items())), lists


@dataclass
class StoreChange:
    written: list[str] = field(default_factory=list)  # paths relative to series/
    removed: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.written or self.removed)


def _write_file(path: Path, data: bytes) -> None:
    write_bytes_atomic(path, data, fault="series.write")


def _same(path: Path, data: bytes) -> bool:
    return path.is_file() and path.read_bytes() == data


def write_store(
    root: Path,
    bases: Mapping[str, BaseSeries],
    *,
    unresolved: Mapping[str, Unresolved] | None = None,
    obsolete: Iterable[str] = (),
    dry_run: bool = False,
) -> StoreChange:
    """Make ``root`` (series/) hold exactly ``bases`` (and the ``unresolved``
    series files of a merge, as given), each patch once, atomically per file.

    A base not in either loses its series file; its ``series/<V>/`` keeps other
    files (``revision``). ``obsolete``: files of an older layout (relative
    paths) to remove once every series is written. Writes nothing when the store
    already has this content; ``dry_run``: only say what it would write."""
    change = StoreChange()
    pool_dir = root / POOL_DIR
    pool, lists = plan(bases, unresolved)
    try:
        new_pool = [name for name, data in pool.items() if not _same(pool_dir / name, data)]
        new_lists = [v for v, text in lists.items() if not _same(root / v / SERIES_FILE, text)]
        dropped = [v for v in _versions(root) if v not in lists]
        gone = sorted(set(obsolete))
        stale = sorted(
            p.name
            for p in (pool_dir.iterdir() if pool_dir.is_dir() else ())
            if p.name not in pool and not p.is_dir() and f"{POOL_DIR}/{p.name}" not in gone
        )
        change.written = [f"{POOL_DIR}/{n}" for n in new_pool]
        change.written += [f"{v}/{SERIES_FILE}" for v in new_lists]
        change.removed = [f"{v}/{SERIES_FILE}" for v in dropped] + gone
        change.removed += [f"{POOL_DIR}/{n}" for n in stale if not n.startswith(".")]
        if dry_run:
            return change
        # new pool files first: every series file written next names only present ones
        for name in new_pool:
            _write_file(pool_dir / name, pool[name])
        faults.point("series.lists")
        for version in new_lists:  # each base's commit point
            _write_file(root / version / SERIES_FILE, lists[version])
        for version in dropped:
            (root / version / SERIES_FILE).unlink()
        faults.point("series.tidy")
        # committed: what no series names any more goes (a killed run's temporary files too)
        for rel in gone:
            (root / rel).unlink(missing_ok=True)
        for name in stale:
            (pool_dir / name).unlink()
        for version in _dirs(root):
            for tmp in (root / version).glob(f".{SERIES_FILE}.*"):
                tmp.unlink()  # a killed run's temporary series file
        for directory in {(root / rel).parent for rel in gone} | {root / v for v in dropped}:
            if directory != root and directory.is_dir() and not any(directory.iterdir()):
                directory.rmdir()
    except OSError as exc:
        if is_fs_fault(exc):
            raise fs_fault(exc, root, "writing the series store") from exc
        raise SeriesError(f"cannot write the series store {root}: {exc}") from exc
    return change


def update_base(root: Path, version: str, base: BaseSeries | None) -> StoreChange:
    """Replace (``None``: drop) one base's series, keeping every other base's."""
    bases = read_all(root)
    if base is None:
        bases.pop(version, None)
    else:
        bases[version] = base
    return write_store(root, bases)


def restore_base(root: Path, version: str, saved: Mapping[Path, bytes]) -> StoreChange:
    """Put ``version``'s series back as a snapshot of its files held it
    (``saved``: path -> bytes of its series file and the pool files; no series
    file: it had none), keeping every other base's."""
    text = saved.get(root / version / SERIES_FILE)
    if text is None:
        return update_base(root, version, None)
    where = f"series/{version}/{SERIES_FILE} (saved)"
    names, comments = parse_series(text.decode(), where)
    pool = Pool(root / POOL_DIR)
    contents = [
        saved[root / POOL_DIR / n] if root / POOL_DIR / n in saved else pool.get(n, where)
        for n in names
    ]
    return update_base(
        root, version, BaseSeries([pool_stem(n) or "" for n in names], contents, comments)
    )


def commit_order(rel: str) -> int:
    """Sort key of paths under series/ written by a copier of a store (the
    backport's stage): pool files before the series files that name them."""
    return 1 if Path(rel).name == SERIES_FILE else 0


def figures(root: Path) -> dict[str, int]:
    """Files, distinct contents, bytes and lines under ``root`` (series/)."""
    files = [p for p in root.rglob("*") if p.is_file()] if root.is_dir() else []
    data = [p.read_bytes() for p in files]
    return {
        "files": len(files),
        "distinct": len({content_hash(d) for d in data}),
        "bytes": sum(len(d) for d in data),
        "lines": sum(d.count(b"\n") for d in data),
    }
