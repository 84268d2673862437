"""The older series layouts, read only to convert them (``vllm-fork series-store``).

Nothing else reads these layouts: series/store.py refuses a store that holds
any of their files and names this conversion. Two older layouts exist:

- the line-delta store (until 2026-11)::

      series/index                  sections ``[V1 V2 ...]`` (the bases that carry the
                                    same series), each with its '#' lines, then one
                                    pool variant ``<stem>.<h>`` per line, in order
      series/pool/<stem>.<h>.patch  a variant in full (the same file the plain store has)
      series/pool/<stem>.<h>.delta  a variant as a line delta against a full one

- the per-base layout: ``series/<V>/series`` (ordered file names, '#'
  comments) and ``series/<V>/NNNN-<stem>.patch``.

Branches written before the conversion still add to them: after merging one,
:func:`convert` folds what it brought into the plain store. While git is
merging (``MERGE_HEAD``), each base is merged three ways against the merge
base's series: the side that changed it wins, and a base both sides changed
gets its series file merged line by line (conflict markers where git's
``merge-file`` finds a conflict, for a person to resolve). Without a merge in
progress, the older layout is the newer copy of the bases it names.
"""

from __future__ import annotations

import io
import re
import tarfile
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from vllm_fork.errors import GitError, SeriesError
from vllm_fork.git import run_git
from vllm_fork.series import store
from vllm_fork.series.store import BaseSeries

INDEX_FILE = "index"
DELTA = ".delta"
DELTA_MAGIC = b"vllm-fork delta 1\n"
LEGACY_HEADER = "# Patch order for `vllm-fork materialize`; written by `vllm-fork export`.\n"
_REF_RE = re.compile(rf"^(?P<stem>[^/\s]+)\.(?P<hash>[0-9a-f]{{{store.HASH_LEN}}})$")


def _lines(data: bytes) -> list[bytes]:
    """``data`` split after each newline (the last line may lack one)."""
    return re.findall(rb"[^\n]*\n|[^\n]+$", data)


# --- the line-delta store ------------------------------------------------------------


def apply_delta(delta: bytes, parent: bytes, where: str) -> bytes:
    """The variant a ``.delta`` file describes: ``= start count`` copies lines of
    ``parent``, ``+ count`` inserts the next ``count`` lines of the delta."""
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
    if store.content_hash(data) != want:
        raise SeriesError(f"{where}: delta does not give the recorded content (sha256 mismatch)")
    return data


def delta_parent(delta: bytes, where: str) -> str:
    lines = _lines(delta)
    if len(lines) < 3 or lines[0] != DELTA_MAGIC or not lines[1].startswith(b"base "):
        raise SeriesError(f"{where}: not a series delta (bad header)")
    return lines[1][5:].decode().strip()


class Pools:
    """Variants by reference (``<stem>.<h>``), read from the first of some
    pool directories that has them, in full or as a delta (resolved)."""

    def __init__(self, directories: Iterable[Path]) -> None:
        self.directories = [d for d in directories if d.is_dir()]
        self._cache: dict[str, bytes] = {}

    def _find(self, name: str) -> Path | None:
        return next((d / name for d in self.directories if (d / name).is_file()), None)

    def get(self, ref: str, where: str, *, _depth: int = 0) -> bytes:
        held = self._cache.get(ref)
        if held is not None:
            return held
        full, delta = self._find(ref + store.PATCH), self._find(ref + DELTA)
        try:
            if full is not None:
                data = full.read_bytes()
            elif delta is not None:
                raw = delta.read_bytes()
                parent = delta_parent(raw, str(delta))
                if _depth > 0 or parent == ref:
                    raise SeriesError(f"{delta}: a delta must be against a full variant")
                data = apply_delta(raw, self.get(parent, str(delta), _depth=1), str(delta))
            else:
                raise SeriesError(
                    f"{where} names {ref}, which is not in series/{store.POOL_DIR}/ (a merge "
                    f"removed it? `git checkout <commit> -- series/{store.POOL_DIR}/{ref}.*`)"
                )
        except OSError as exc:
            raise SeriesError(f"cannot read pool variant {ref}: {exc}") from exc
        if not ref.endswith("." + store.content_hash(data)[: store.HASH_LEN]):
            raise SeriesError(
                f"series/{store.POOL_DIR}/{ref}: content does not match its name (a merge that "
                "applied an edit to it? take it from the side that wrote it)"
            )
        self._cache[ref] = data
        return data


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


def read_index(root: Path, pools: Pools) -> dict[str, BaseSeries]:
    """The bases of ``root/index`` (none when there is no index)."""
    index = root / INDEX_FILE
    if not index.is_file():
        return {}
    out: dict[str, BaseSeries] = {}
    where = f"series/{INDEX_FILE}"
    for bases, comments, refs in parse_index(index.read_text(), where):
        stems = [_REF_RE.match(r).group("stem") for r in refs]  # type: ignore[union-attr]
        contents = [pools.get(r, where) for r in refs]
        for version in bases:
            out[version] = BaseSeries(list(stems), list(contents), list(comments))
    return out


# --- the per-base layout ---------------------------------------------------------------


def is_per_base(directory: Path) -> bool:
    """Whether series/<V>/ holds a series of the per-base layout (its series file
    names files of its own; a conversion killed before it removed them leaves
    them beside a plain series file, which wins)."""
    series = directory / store.SERIES_FILE
    if not series.is_file():
        return any(directory.glob("*" + store.PATCH))
    lines = series.read_text().splitlines(keepends=True)
    entries = [ln.split("#", 1)[0].strip() for ln in lines]
    return lines[:1] == [LEGACY_HEADER] or any(
        e and not e.startswith(store.MARKERS) and store.pool_stem(e) is None for e in entries
    )


def is_older(rel: str) -> bool:
    """Whether ``rel`` (relative to series/) is a file of an older layout."""
    parts = rel.split("/")
    if parts == [INDEX_FILE]:
        return True
    if len(parts) == 2 and parts[0] == store.POOL_DIR:
        return parts[1].endswith(DELTA) and _REF_RE.match(parts[1][: -len(DELTA)]) is not None
    return len(parts) == 2 and parts[1].endswith(store.PATCH)


def read_per_base(directory: Path) -> BaseSeries:
    series_file = directory / store.SERIES_FILE
    where = f"series/{directory.name}/{store.SERIES_FILE}"
    names: list[str] = []
    comments: list[str] = []
    text = series_file.read_text() if series_file.is_file() else ""
    for lineno, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("#"):
            if f"{line}\n" != LEGACY_HEADER:
                comments.append(line)
            continue
        entry = line.split("#", 1)[0].strip()
        if not entry:
            continue
        if "/" in entry or entry in (".", ".."):
            raise SeriesError(f"{where}:{lineno}: {entry!r} is not a plain file name")
        if entry in names:
            raise SeriesError(f"{where}:{lineno}: {entry} is listed twice")
        names.append(entry)
    listed = set(names)
    strays = sorted(p.name for p in directory.glob("*" + store.PATCH) if p.name not in listed)
    if strays:
        raise SeriesError(f"series/{directory.name}: patch file(s) not listed: {', '.join(strays)}")
    contents: list[bytes] = []
    for name in names:
        path = directory / name
        if not path.is_file():
            raise SeriesError(f"{where} lists {name}, which does not exist")
        contents.append(path.read_bytes())
    return BaseSeries([store.stem_of(n) for n in names], contents, comments)


# --- every layout at once --------------------------------------------------------------


@dataclass
class Layouts:
    """What series/ holds in each layout: the bases of the index, of per-base
    directories and of plain series files, and the older layout's files."""

    index: dict[str, BaseSeries] | None = None  # None: no series/index
    per_base: dict[str, BaseSeries] = field(default_factory=dict)
    plain: dict[str, BaseSeries] = field(default_factory=dict)
    obsolete: list[str] = field(default_factory=list)  # relative to series/

    def merged(self) -> dict[str, BaseSeries]:
        """The bases, an older layout's copy taking precedence (it was merged in)."""
        out = {**self.plain, **(self.index or {}), **self.per_base}
        return {v: out[v] for v in store.sort_versions(out)}


def read_layouts(root: Path, extra_pools: Iterable[Path] = ()) -> Layouts:
    """Every base's series under ``root`` (series/), in whichever layout it is."""
    pools = Pools([root / store.POOL_DIR, *extra_pools])
    out = Layouts(obsolete=[rel for rel in store.old_layout(root) if is_older(rel)])
    if (root / INDEX_FILE).is_file():
        out.index = read_index(root, pools)
    if not root.is_dir():
        return out
    for directory in sorted(p for p in root.iterdir() if p.is_dir() and p.name != store.POOL_DIR):
        version = directory.name
        if is_per_base(directory):
            out.per_base[version] = read_per_base(directory)
            continue
        series = directory / store.SERIES_FILE
        if series.is_file():
            names, comments = store.parse_series(series.read_text(), str(series))
            where = f"series/{version}/{store.SERIES_FILE}"
            out.plain[version] = BaseSeries(
                [store.pool_stem(n) or "" for n in names],
                [pools.get(n[: -len(store.PATCH)], where) for n in names],
                comments,
            )
    return out


# --- the three-way merge of a base's series ------------------------------------------

Conflict = store.Unresolved


def _git_root(root: Path) -> tuple[Path, str] | None:
    """(work tree top, ``root`` relative to it) when ``root`` is in a git work tree."""
    proc = run_git(["rev-parse", "--show-toplevel"], cwd=root, check=False)
    if proc.returncode != 0:
        return None
    top = Path(proc.stdout.decode().strip())
    try:
        return top, root.resolve().relative_to(top.resolve()).as_posix()
    except ValueError:
        return None


def merge_ancestor(root: Path, into: Path) -> Path | None:
    """The series/ directory of the merge base of a merge in progress, extracted
    under ``into`` (None: no merge in progress, or series/ not in git there)."""
    where = _git_root(root)
    if where is None:
        return None
    top, rel = where
    proc = run_git(["rev-parse", "-q", "--verify", "MERGE_HEAD"], cwd=top, check=False)
    if proc.returncode != 0:
        return None
    proc = run_git(["merge-base", "HEAD", "MERGE_HEAD"], cwd=top, check=False)
    if proc.returncode != 0:
        return None
    commit = proc.stdout.decode().split()[0]
    try:
        tar = run_git(["archive", "--format=tar", commit, "--", rel], cwd=top).stdout
    except GitError:
        return None  # no series/ there
    with tarfile.open(fileobj=io.BytesIO(tar)) as archive:
        if hasattr(tarfile, "data_filter"):
            archive.extractall(into, filter="data")
        else:  # pragma: no cover - a Python without extraction filters
            archive.extractall(into)
    return into / rel


def merge_lists(ours: bytes, base: bytes, theirs: bytes, labels: tuple[str, str, str]) -> bytes:
    """``git merge-file`` of three series files (conflict markers where both changed)."""
    with tempfile.TemporaryDirectory(prefix="vllm-fork-merge-") as tmp:
        paths = [Path(tmp) / name for name in ("ours", "base", "theirs")]
        for path, data in zip(paths, (ours, base, theirs), strict=True):
            path.write_bytes(data)
        args = ["merge-file", "-p"]
        for label in labels:
            args += ["-L", label]
        proc = run_git([*args, *paths], check=False)
        if proc.returncode < 0 or proc.returncode > 127:
            raise SeriesError(f"git merge-file failed: {proc.stderr.decode().strip()}")
        return proc.stdout


def _text(base: BaseSeries | None) -> bytes:
    return store.render_series(base) if base is not None else b""


def _key(base: BaseSeries | None) -> object:
    return base.key() if base is not None else None


def three_way(
    version: str,
    ancestor: BaseSeries | None,
    older: BaseSeries | None,
    plain: BaseSeries | None,
    lookup: Callable[[str, str], bytes],
) -> BaseSeries | Conflict | None:
    """A base's series from its merge base's, the older layout's and the plain
    store's: the side that changed it, or both changes merged line by line."""
    if _key(older) == _key(ancestor) or _key(older) == _key(plain):
        return plain
    if _key(plain) == _key(ancestor):
        return older
    where = f"series/{version}/{store.SERIES_FILE}"
    text = merge_lists(
        _text(plain),
        _text(ancestor),
        _text(older),
        (where, "merge base", f"series/{INDEX_FILE} (merged in)"),
    )
    try:
        names, comments = store.parse_series(text.decode(), where)
    except SeriesError:  # conflict markers: for a person to resolve
        sides = [b for b in (plain, older) if b is not None]
        patches = {n: d for b in sides for n, d in zip(b.pool_names, b.contents, strict=True)}
        return Conflict(text, patches)
    stems = [store.pool_stem(n) or "" for n in names]
    return BaseSeries(stems, [lookup(n, where) for n in names], comments)


@dataclass
class Conversion:
    bases: dict[str, BaseSeries]
    conflicts: dict[str, Conflict]
    obsolete: list[str]
    notes: list[str]


def plan_conversion(root: Path) -> Conversion:
    """What ``series/`` becomes in the plain layout (see the module's docstring)."""
    unknown = [rel for rel in store.old_layout(root) if not is_older(rel)]
    if unknown:
        raise SeriesError(
            f"{root}: {', '.join(unknown)} belong(s) to no series layout; move it elsewhere"
        )
    with tempfile.TemporaryDirectory(prefix="vllm-fork-ancestor-") as tmp:
        has_index = (root / INDEX_FILE).is_file()
        ancestor_root = merge_ancestor(root, Path(tmp)) if has_index else None
        if ancestor_root is None:
            return _without_ancestor(read_layouts(root))
        # the merge may have dropped files the merge base had: read those there
        extra = ancestor_root / store.POOL_DIR
        layouts = read_layouts(root, [extra])
        ancestor = read_layouts(ancestor_root).merged()
        pools = Pools([root / store.POOL_DIR, extra])

        def lookup(name: str, where: str) -> bytes:
            return pools.get(name[: -len(store.PATCH)], where)

        bases: dict[str, BaseSeries] = {}
        conflicts: dict[str, Conflict] = {}
        notes: list[str] = []
        older = {**(layouts.index or {}), **layouts.per_base}
        for version in store.sort_versions({*older, *layouts.plain, *ancestor}):
            got = three_way(
                version,
                ancestor.get(version),
                older.get(version),
                layouts.plain.get(version),
                lookup,
            )
            if isinstance(got, Conflict):
                conflicts[version] = got
                notes.append(
                    f"series/{version}/{store.SERIES_FILE}: both sides changed it; conflict "
                    "markers left there for you to resolve"
                )
            elif got is not None:
                bases[version] = got
        return Conversion(bases, conflicts, layouts.obsolete, notes)


def _without_ancestor(layouts: Layouts) -> Conversion:
    notes = [
        f"series/{v}/{store.SERIES_FILE}: replaced by the older layout's series "
        "(no merge in progress to tell which side changed it)"
        for v, b in {**(layouts.index or {}), **layouts.per_base}.items()
        if v in layouts.plain and b.key() != layouts.plain[v].key()
    ]
    return Conversion(layouts.merged(), {}, layouts.obsolete, notes)


@dataclass
class ConvertResult:
    bases: int
    change: store.StoreChange
    before: dict[str, int]
    after: dict[str, int]
    notes: list[str]
    conflicts: list[str]


def convert(root: Path, *, check: bool = False) -> ConvertResult:
    """Write ``root`` (series/) in the plain layout, whatever layouts it holds
    (idempotent; ``check``: only say what would change). The caller holds the
    series lock."""
    before = store.figures(root)
    if store.old_layout(root):
        plan = plan_conversion(root)
    else:  # the plain layout already: only tidy it (the one reader checks every file)
        plan = Conversion(store.read_all(root), {}, [], [])
    change = store.write_store(
        root, plan.bases, unresolved=plan.conflicts, obsolete=plan.obsolete, dry_run=check
    )
    after = before if check else store.figures(root)
    return ConvertResult(len(plan.bases), change, before, after, plan.notes, sorted(plan.conflicts))
