"""Stored-once series: every distinct patch is kept once under ``series/pool/``.

Layout (docs/series-format.md)::

    series/index                 one section per distinct series, naming the bases
                                 that carry it: ``[0.20.0 0.20.1 0.20.2]``, then its
                                 '#' comment lines (the Applied-Upstream history), then
                                 one pool variant per line, in patch order
    series/pool/<stem>.<h>.patch a patch variant, byte for byte what
                                 ``git format-patch`` wrote (``h``: the first 10 hex
                                 digits of the sha256 of those bytes)
    series/pool/<stem>.<h>.delta the same, stored as a line delta against another
                                 variant of the same logical patch (a full ``.patch``)
    series/<V>/revision          optional, as before (series/forkversion.py)

A base's patch ``i`` (from 1) is ``<i:04d>-<stem>.patch``: the name
``git format-patch`` gives it, so a materialized and unchanged tree exports
the same names and bytes. The legacy layout (``series/<V>/series`` and
``series/<V>/*.patch``) is still read: where a base has it, it overrides the
index (a per-base series merged in after the conversion is the newer), and
:func:`write_store` (``vllm-fork series-store``) folds it into the store.

Writing is atomic: new pool files are written first (each by rename), the
index is replaced by one rename (the commit point), and only then pool files
no base references and converted legacy files are removed. A run killed or
failing at any point leaves the old index and every pool file it names.
"""

from __future__ import annotations

import atexit
import hashlib
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from difflib import SequenceMatcher
from pathlib import Path

from packaging.version import InvalidVersion, Version

from vllm_fork import faults
from vllm_fork.atomic import write_bytes_atomic
from vllm_fork.errors import SeriesError, fs_fault, is_fs_fault

log = logging.getLogger(__name__)

SERIES_FILE = "series"
INDEX_FILE = "index"
POOL_DIR = "pool"
FULL = ".patch"
DELTA = ".delta"
HASH_LEN = 10
DELTA_MAGIC = b"vllm-fork delta 1\n"
# a delta is kept only when it is at most this share of the full variant's lines
DELTA_RATIO = 0.5
INDEX_HEADER = (
    "# Stored-once series (docs/series-format.md), written by `vllm-fork export`.\n"
    "# [bases]: one series; its '#' lines, then its patches (series/pool/) in order.\n"
)
LEGACY_HEADER = "# Patch order for `vllm-fork materialize`; written by `vllm-fork export`.\n"
_NAME_RE = re.compile(r"^[0-9]{4}-(?P<stem>.+)\.patch$")
_REF_RE = re.compile(rf"^(?P<stem>[^/\s]+)\.(?P<hash>[0-9a-f]{{{HASH_LEN}}})$")
_ID_RE = re.compile(rb"^Fork-Patch:[ \t]*(\S.*?)\s*$", re.MULTILINE)
_SUBJECT_RE = re.compile(rb"^Subject:[ \t]*(.*?)\s*$", re.MULTILINE)


@dataclass
class BaseSeries:
    """One base's series: patch stems and bytes in order, and its comment lines."""

    stems: list[str] = field(default_factory=list)
    contents: list[bytes] = field(default_factory=list)
    comments: list[str] = field(default_factory=list)  # each a '#' line, no newline
    # the file names of a legacy series/<V>/ (None: as git format-patch names them)
    legacy_names: list[str] | None = None

    @property
    def names(self) -> list[str]:
        if self.legacy_names is not None and len(self.legacy_names) == len(self.stems):
            return list(self.legacy_names)
        return [patch_name(i, stem) for i, stem in enumerate(self.stems, 1)]

    def key(self) -> tuple[object, ...]:
        return (tuple(self.comments), tuple(self.stems), tuple(self.contents))


def patch_name(position: int, stem: str) -> str:
    """The file name ``git format-patch`` gives patch ``position`` (from 1)."""
    return f"{position:04d}-{stem}.patch"


def stem_of(name: str) -> str:
    m = _NAME_RE.match(name)
    if m:
        return m.group("stem")
    return name[: -len(FULL)] if name.endswith(FULL) else name


def content_hash(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def variant_ref(stem: str, data: bytes) -> str:
    return f"{stem}.{content_hash(data)[:HASH_LEN]}"


def logical_id(data: bytes) -> str:
    """The patch's identity across bases: its ``Fork-Patch`` trailer, else its subject."""
    message = data.split(b"\n---\n", 1)[0]
    found = _ID_RE.findall(message)
    if found:
        return found[-1].decode(errors="replace")
    subject = _SUBJECT_RE.search(data)
    return subject.group(1).decode(errors="replace") if subject else ""


def _lines(data: bytes) -> list[bytes]:
    """``data`` split after each newline (the last line may lack one)."""
    return re.findall(rb"[^\n]*\n|[^\n]+$", data)


def _version_key(version: str) -> tuple[int, Version | str]:
    try:
        return (0, Version(version))
    except InvalidVersion:
        return (1, version)


def sort_versions(versions: Iterable[str]) -> list[str]:
    return sorted(versions, key=_version_key)


# --- deltas -----------------------------------------------------------------------------


def make_delta(parent_ref: str, parent: bytes, data: bytes) -> bytes:
    """``data`` as copy/insert operations on the lines of ``parent``."""
    old, new = _lines(parent), _lines(data)
    out = [DELTA_MAGIC, f"base {parent_ref}\nsha256 {content_hash(data)}\n".encode()]
    matcher = SequenceMatcher(None, old, new, autojunk=False)
    for op, i1, i2, j1, j2 in matcher.get_opcodes():
        if op == "equal":
            out.append(f"= {i1} {i2 - i1}\n".encode())
        elif j2 > j1:
            out.append(f"+ {j2 - j1}\n".encode())
            out.extend(new[j1:j2])
    # a literal last line without a newline would swallow the next op: none follows
    return b"".join(out)


def delta_parent(delta: bytes) -> str:
    lines = _lines(delta)
    if len(lines) < 3 or lines[0] != DELTA_MAGIC or not lines[1].startswith(b"base "):
        raise SeriesError("not a series delta (bad header)")
    return lines[1][5:].decode().strip()


def apply_delta(delta: bytes, parent: bytes, where: str) -> bytes:
    lines = _lines(delta)
    try:
        if lines[0] != DELTA_MAGIC or not lines[2].startswith(b"sha256 "):
            raise ValueError("bad header")
        want = lines[2][7:].decode().strip()
        old = _lines(parent)
        out: list[bytes] = []
        at = 3
        while at < len(lines):
            op, a, *b = lines[at].decode().split()
            at += 1
            if op == "=":
                start, count = int(a), int(b[0])
                if start + count > len(old):
                    raise ValueError("copy past the end of the base")
                out.extend(old[start : start + count])
            elif op == "+":
                count = int(a)
                if at + count > len(lines):
                    raise ValueError("truncated literal lines")
                out.extend(lines[at : at + count])
                at += count
            else:
                raise ValueError(f"unknown operation {op!r}")
    except (ValueError, IndexError, UnicodeDecodeError) as exc:
        raise SeriesError(f"{where}: malformed delta: {exc}") from None
    data = b"".join(out)
    if content_hash(data) != want:
        raise SeriesError(f"{where}: delta does not give the recorded content (sha256 mismatch)")
    return data


# --- reading ----------------------------------------------------------------------------


def read_series_file(series_dir: Path) -> list[str]:
    """Patch file names in order of a legacy ``series/<V>/series`` file; an absent
    series directory is an empty series."""
    series_file = series_dir / SERIES_FILE
    if not series_dir.exists():
        return []
    if not series_file.is_file():
        if any(series_dir.glob("*.patch")):
            raise SeriesError(f"{series_dir} has patches but no {SERIES_FILE} file")
        return []
    names: list[str] = []
    for lineno, line in enumerate(series_file.read_text().splitlines(), 1):
        entry = line.split("#", 1)[0].strip()
        if not entry:
            continue
        if "/" in entry or entry in (".", ".."):
            raise SeriesError(f"{series_file}:{lineno}: {entry!r} is not a plain file name")
        if entry in names:
            raise SeriesError(f"{series_file}:{lineno}: {entry} is listed twice")
        names.append(entry)
    return names


def _legacy_comments(series_file: Path) -> list[str]:
    if not series_file.is_file():
        return []
    own = set(LEGACY_HEADER.splitlines())
    return [
        line.rstrip("\n")
        for line in series_file.read_text().splitlines()
        if line.lstrip().startswith("#") and line not in own
    ]


def parse_index(text: str, where: str) -> list[tuple[list[str], list[str], list[str]]]:
    """Sections of an index: (bases, comment lines, pool refs)."""
    sections: list[tuple[list[str], list[str], list[str]]] = []
    seen: set[str] = set()
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        if line.startswith("["):
            if not line.endswith("]") or not line[1:-1].split():
                raise SeriesError(f"{where}:{lineno}: bad section line {raw!r}")
            bases = line[1:-1].split()
            for base in bases:
                if base in seen:
                    raise SeriesError(f"{where}:{lineno}: base {base} has two series")
                seen.add(base)
            sections.append((bases, [], []))
        elif line.startswith("#"):
            if sections:
                sections[-1][1].append(raw)
        elif not sections:
            raise SeriesError(f"{where}:{lineno}: a patch before the first [bases] line")
        elif not _REF_RE.match(line):
            raise SeriesError(f"{where}:{lineno}: {line!r} is not a pool variant name")
        else:
            sections[-1][2].append(line)
    return sections


class Pool:
    """The variants of ``series/pool/``, decoded on demand (deltas resolved)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._cache: dict[str, bytes] = {}

    def get(self, ref: str, *, _depth: int = 0) -> bytes:
        held = self._cache.get(ref)
        if held is not None:
            return held
        full, delta = self.directory / f"{ref}{FULL}", self.directory / f"{ref}{DELTA}"
        try:
            if full.is_file():
                data = full.read_bytes()
            elif delta.is_file():
                raw = delta.read_bytes()
                parent = delta_parent(raw)
                if _depth > 0 or parent == ref:
                    raise SeriesError(f"{delta}: a delta must be against a full variant")
                data = apply_delta(raw, self.get(parent, _depth=1), str(delta))
            else:
                raise SeriesError(
                    f"series/{INDEX_FILE} names {ref}, which is not in series/{POOL_DIR}/"
                )
        except OSError as exc:
            raise SeriesError(f"cannot read pool variant {ref}: {exc}") from exc
        if not ref.endswith("." + content_hash(data)[:HASH_LEN]):
            raise SeriesError(
                f"series/{POOL_DIR}/{ref}: content does not match its name (a merge that "
                "applied a per-base edit to it? take that branch's series/<V>/ directories and "
                "run `vllm-fork series-store`: docs/series-format.md)"
            )
        self._cache[ref] = data
        return data


def read_index(
    root: Path, skip: Iterable[str] = (), only: str | None = None
) -> dict[str, BaseSeries]:
    """The bases named by ``root/index`` (``root``: the series/ directory), less
    those in ``skip`` (their variants are not read); ``only``: just that base's."""
    index = root / INDEX_FILE
    if not index.is_file():
        return {}
    pool = Pool(root / POOL_DIR)
    out: dict[str, BaseSeries] = {}
    skipped = set(skip)
    for bases, comments, refs in parse_index(index.read_text(), str(index)):
        bases = [b for b in bases if b not in skipped and only in (None, b)]
        if not bases:
            continue
        stems = [_REF_RE.match(r).group("stem") for r in refs]  # type: ignore[union-attr]
        contents = [pool.get(r) for r in refs]
        for base in bases:
            out[base] = BaseSeries(list(stems), list(contents), list(comments))
    return out


def read_legacy(series_dir: Path) -> BaseSeries:
    names = read_series_file(series_dir)
    contents: list[bytes] = []
    for name in names:
        path = series_dir / name
        if not path.is_file():
            raise SeriesError(f"{series_dir / SERIES_FILE} lists {name}, which does not exist")
        contents.append(path.read_bytes())
    listed = set(names)
    strays = sorted(p.name for p in series_dir.glob("*.patch") if p.name not in listed)
    if strays:
        raise SeriesError(
            f"{series_dir}: patch file(s) not listed in {SERIES_FILE}: {', '.join(strays)}"
        )
    return BaseSeries(
        [stem_of(n) for n in names], contents, _legacy_comments(series_dir / SERIES_FILE), names
    )


def legacy_bases(root: Path) -> list[str]:
    """Bases with a legacy ``series/<V>/series`` file."""
    if not root.is_dir():
        return []
    return sort_versions(
        p.name for p in root.iterdir() if p.is_dir() and (p / SERIES_FILE).is_file()
    )


def versions(root: Path) -> list[str]:
    """Every base with a series (either layout), oldest first."""
    index = root / INDEX_FILE
    named: set[str] = set(legacy_bases(root))
    if index.is_file():
        for bases, _, _ in parse_index(index.read_text(), str(index)):
            named.update(bases)
    return sort_versions(named)


def read_all(root: Path) -> dict[str, BaseSeries]:
    """Every base's series: the index's, where a legacy ``series/<V>/series``
    overrides it (a per-base series merged or copied in after the conversion is
    the newer; :func:`write_store` folds it into the store)."""
    legacy = legacy_bases(root)
    out = read_index(root, skip=legacy)
    for base in legacy:
        out[base] = read_legacy(root / base)
    return {v: out[v] for v in sort_versions(out)}


def in_index(root: Path, version: str) -> bool:
    index = root / INDEX_FILE
    if not index.is_file():
        return False
    for line in index.read_text().splitlines():
        line = line.strip()
        if line.startswith("[") and version in line[1:-1].split():
            return True
    return False


def has_series(root: Path, version: str) -> bool:
    return in_index(root, version) or (root / version / SERIES_FILE).is_file()


def read_base(root: Path, version: str) -> BaseSeries | None:
    """``version``'s series (None: it has none); a legacy ``series/<V>/series``
    overrides the index (see :func:`read_all`)."""
    if (root / version / SERIES_FILE).is_file():
        return read_legacy(root / version)
    if in_index(root, version):
        return read_index(root, only=version)[version]
    if (root / version).is_dir():
        return read_legacy(root / version)
    return None


def stamp_paths(root: Path, version: str) -> list[Path]:
    """The files whose change may change ``version``'s series (for memoizing)."""
    paths = [root / INDEX_FILE, root / POOL_DIR, root / version]
    directory = root / version
    if directory.is_dir():
        paths.extend(sorted(directory.iterdir()))
    return paths


def digest(base: BaseSeries) -> str:
    """sha256 over a series as it is applied: names, bytes and comment lines."""
    h = hashlib.sha256()
    for line in base.comments:
        h.update(f"#\0{line}\0".encode())
    for name, data in zip(base.names, base.contents, strict=True):
        h.update(f"{name}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()


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
    (for ``git am``/``git apply``); made once per content in this process."""
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
                tmp = path.with_name(f".{path.name}.part")
                tmp.write_bytes(data)
                os.replace(tmp, path)
    else:
        tmp = Path(tempfile.mkdtemp(dir=directory.parent, prefix=".part-"))
        for name, data in zip(base.names, base.contents, strict=True):
            (tmp / name).write_bytes(data)
        try:
            os.rename(tmp, directory)
        except OSError:  # made meanwhile
            shutil.rmtree(tmp, ignore_errors=True)
    return directory, paths


# --- writing ----------------------------------------------------------------------------


def plan_pool(bases: dict[str, BaseSeries]) -> dict[str, bytes]:
    """Pool file name -> file bytes for ``bases`` (deterministic in their content).

    Variants of one logical patch (:func:`logical_id`) are stored as deltas
    against the variant the newest base carries when that is at most
    ``DELTA_RATIO`` of the full lines; every other variant in full."""
    newest: dict[str, tuple[tuple[int, Version | str], str, bytes]] = {}
    variants: dict[str, tuple[str, bytes]] = {}
    for version, base in bases.items():
        for stem, data in zip(base.stems, base.contents, strict=True):
            ref = variant_ref(stem, data)
            variants[ref] = (stem, data)
            key = (_version_key(version), ref, data)
            ident = logical_id(data)
            held = newest.get(ident)
            if held is None or (key[0], key[1]) > (held[0], held[1]):
                newest[ident] = key
    files: dict[str, bytes] = {}
    for ref, (_stem, data) in sorted(variants.items()):
        root = newest[logical_id(data)]
        if root[1] != ref:
            delta = make_delta(root[1], root[2], data)
            if delta.count(b"\n") <= DELTA_RATIO * data.count(b"\n"):
                files[ref + DELTA] = delta
                continue
        files[ref + FULL] = data
    # a delta's base must be stored in full
    for name, data in list(files.items()):
        if name.endswith(DELTA):
            parent = delta_parent(data)
            if parent + FULL not in files:
                files.pop(name)
                files[name[: -len(DELTA)] + FULL] = variants[name[: -len(DELTA)]][1]
    return files


def render_index(bases: dict[str, BaseSeries]) -> str:
    groups: dict[tuple[object, ...], list[str]] = {}
    for version in sort_versions(bases):
        groups.setdefault(bases[version].key(), []).append(version)
    out = [INDEX_HEADER]
    for versions in groups.values():
        base = bases[versions[0]]
        out.append(f"[{' '.join(versions)}]\n")
        out.extend(f"{line}\n" for line in base.comments)
        out.extend(f"{variant_ref(s, d)}\n" for s, d in zip(base.stems, base.contents, strict=True))
    return "".join(out)


def _write_file(path: Path, data: bytes) -> None:
    write_bytes_atomic(path, data, fault="series.write")


@dataclass
class StoreChange:
    written: list[str] = field(default_factory=list)  # paths relative to series/
    removed: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.written or self.removed)


def write_store(root: Path, bases: dict[str, BaseSeries]) -> StoreChange:
    """Make ``root`` (series/) hold exactly ``bases``, stored once, atomically.

    Bases not in ``bases`` are dropped from the index (and their legacy files
    removed); a base whose ``series/<V>/`` holds other files (``revision``)
    keeps them. Writes nothing when the store already has this content."""
    bases = {v: bases[v] for v in sort_versions(bases) if bases[v].stems or bases[v].comments}
    change = StoreChange()
    pool_dir = root / POOL_DIR
    files = plan_pool(bases)
    index_text = render_index(bases).encode()
    try:
        pool_dir.mkdir(parents=True, exist_ok=True)
        for name, data in files.items():
            target = pool_dir / name
            if not target.is_file() or target.read_bytes() != data:
                _write_file(target, data)
                change.written.append(f"{POOL_DIR}/{name}")
        faults.point("series.index")
        index = root / INDEX_FILE
        if not index.is_file() or index.read_bytes() != index_text:
            _write_file(index, index_text)
            change.written.append(INDEX_FILE)
        # committed: what no base references any more goes
        for path in sorted(pool_dir.iterdir()):
            if path.name not in files and path.suffix in (FULL, DELTA):
                path.unlink()
                change.removed.append(f"{POOL_DIR}/{path.name}")
            elif path.name.startswith(".") and not path.is_dir():
                path.unlink()  # a temporary file of a killed run
        for version in legacy_bases(root):
            directory = root / version
            for path in sorted(directory.iterdir()):
                if path.name == SERIES_FILE or path.suffix == FULL:
                    path.unlink()
                    change.removed.append(f"{version}/{path.name}")
            if not any(directory.iterdir()):
                directory.rmdir()
    except OSError as exc:
        if is_fs_fault(exc):
            raise fs_fault(exc, root, "writing the series store") from exc
        raise SeriesError(f"cannot write the series store {root}: {exc}") from exc
    return change


def is_stored(root: Path) -> bool:
    """Whether ``root`` (series/) uses the stored-once layout (it has an index);
    writers keep a legacy repository legacy until ``vllm-fork series-store``."""
    return (root / INDEX_FILE).is_file()


def write_legacy(series_dir: Path, names: list[str], contents: list[bytes]) -> StoreChange:
    """Write one base in the legacy layout (series/<V>/series and its patch files):
    changed patch files are rewritten, stale ones removed, and the series file is
    rewritten (its comment lines kept after the list) only when the list changed."""
    change = StoreChange()
    series_dir.mkdir(parents=True, exist_ok=True)
    for name, data in zip(names, contents, strict=True):
        target = series_dir / name
        if not target.is_file() or target.read_bytes() != data:
            _write_file(target, data)
            change.written.append(name)
    keep = set(names)
    for stale in sorted(series_dir.glob("*" + FULL)):
        if stale.name not in keep:
            stale.unlink()
            change.removed.append(stale.name)
    series_file = series_dir / SERIES_FILE
    current = read_series_file(series_dir) if series_file.is_file() else None
    if current != names:
        comments = "".join(f"{line}\n" for line in _legacy_comments(series_file))
        text = LEGACY_HEADER + "".join(f"{n}\n" for n in names) + comments
        _write_file(series_file, text.encode())
        change.written.append(SERIES_FILE)
    return change


def update_base(root: Path, version: str, base: BaseSeries | None) -> StoreChange:
    """Replace (``None``: drop) one base's series, keeping every other base's
    (a legacy repository: only series/<V>/ is written)."""
    if not is_stored(root):
        if base is None:
            return StoreChange()
        return write_legacy(root / version, base.names, base.contents)
    bases = read_all(root)
    if base is None:
        bases.pop(version, None)
    else:
        bases[version] = base
    return write_store(root, bases)


def figures(root: Path) -> dict[str, int]:
    """Files, distinct contents and lines under ``root`` (series/)."""
    files = [p for p in root.rglob("*") if p.is_file()]
    return {
        "files": len(files),
        "distinct": len({content_hash(p.read_bytes()) for p in files}),
        "lines": sum(p.read_bytes().count(b"\n") for p in files),
    }
