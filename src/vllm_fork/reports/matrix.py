"""`vllm-fork matrix`: for each pinned release, where each change stands and
whether the series applies: each release's own series (``series/<V>/``,
the default of the command line), or one series projected onto every
release (``--series V``, what a rebase of it would meet).

A release's row comes from its pristine upstream tree in the cached
repository: the probes say whether upstream has each change (or lacks the
code it modifies), and the series is applied the way a rebase would (change
patches upstream absorbed are skipped, everything else is applied with
``git apply --cached --3way``) into a temporary index, with new objects in a
temporary object directory, so neither a work tree nor the cache changes.

Rows are cached under ``<cache>/matrix/``, keyed by the release's pinned
sdist sha256, the series content and the code that computes them.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from packaging.version import Version

from vllm_fork import probes
from vllm_fork.config import Config
from vllm_fork.errors import ForkError, SeriesError, UsageError
from vllm_fork.facts import registry, state
from vllm_fork.facts.names import tag_for
from vllm_fork.facts.state import LEGEND, PART_CHANGE, decide
from vllm_fork.git import git_env, git_out, run_git
from vllm_fork.hashing import sha256_bytes
from vllm_fork.probes import GitTree, probe_all
from vllm_fork.series.patches import Series
from vllm_fork.sources.fetch import Fetcher
from vllm_fork.sources.pins import Pins
from vllm_fork.sources.upstream import ensure_upstream
from vllm_fork.sources.workspace import Workspace

P_APPLIED = "applied"
P_ABSORBED = "absorbed"
P_EMPTY = "empty"
P_FAILED = "failed"

SCHEMA = 1
Log = Callable[[str], None]


@dataclass
class PatchResult:
    file: str
    change: str
    part: str
    result: str
    detail: str = ""


@dataclass
class ChangeCell:
    state: str
    reason: str
    hardening: dict[str, bool] = field(default_factory=dict)
    patches: list[str] = field(default_factory=list)


@dataclass
class ReleaseRow:
    version: str
    sdist_sha256: str
    changes: dict[str, ChangeCell] = field(default_factory=dict)
    patches: list[PatchResult] = field(default_factory=list)
    error: str | None = None
    cached: bool = False
    series_base: str = ""  # whose series was applied ("" for none: the release has none)

    @property
    def series_applies(self) -> bool | None:
        if self.error is not None:
            return None
        return all(p.result != P_FAILED for p in self.patches)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        del data["cached"]
        data["series_applies"] = self.series_applies
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ReleaseRow:
        return cls(
            version=data["version"],
            sdist_sha256=data["sdist_sha256"],
            changes={k: ChangeCell(**v) for k, v in data["changes"].items()},
            patches=[PatchResult(**p) for p in data["patches"]],
            error=data.get("error"),
            series_base=data.get("series_base", ""),
        )


@dataclass
class Matrix:
    series_version: str
    series_hash: str
    series_patches: list[str]
    changes: list[str]
    rows: list[ReleaseRow]
    own: bool = False  # each release's own series (series_* fields: the default base's)

    @property
    def unavailable(self) -> list[str]:
        return [r.version for r in self.rows if r.error is not None]

    def to_json(self) -> dict[str, Any]:
        return {
            "mode": "own" if self.own else "projected",
            "series": {
                "base": self.series_version,
                "sha256": self.series_hash,
                "patches": self.series_patches,
            },
            "changes": self.changes,
            "releases": [r.to_json() for r in self.rows],
        }


# --- inputs ------------------------------------------------------------------------


def select_releases(pins: Pins, releases: list[str] | None) -> list[str]:
    """The releases asked for (pinned), or every pinned one from the oldest to the
    newest supported base."""
    if releases:
        for version in releases:
            pins.get(version)  # UnknownVersionError names the pinned ones
        return sorted(set(releases), key=Version)
    supported = [v for v in pins.versions() if pins.bases[v].supported]
    if not supported:
        raise UsageError("bases.toml marks no base as supported; pass --releases")
    low, high = Version(supported[0]), Version(supported[-1])
    return [v for v in pins.versions() if low <= Version(v) <= high]


def series_hash(series: Series) -> str:
    return series.digest()


def code_hash() -> str:
    """Hash of the code a row depends on: this module, the change registry, the
    state rule and the probes."""
    files = [Path(__file__), Path(registry.__file__), Path(state.__file__)]
    probes_path = Path(probes.__file__)
    if probes_path.name == "__init__.py":
        files += sorted(probes_path.parent.glob("*.py"))
    else:
        files.append(probes_path)
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    # a change registered at run time (not in the module's text) changes the rows too
    digest.update(repr(registry.changes()).encode())
    return digest.hexdigest()


def row_key(sdist_sha256: str, series_sha: str, code_sha: str) -> str:
    text = json.dumps(
        {"schema": SCHEMA, "sdist": sdist_sha256, "series": series_sha, "code": code_sha},
        sort_keys=True,
    )
    return sha256_bytes(text.encode())


# --- the row cache -----------------------------------------------------------------


def _cache_file(config: Config, version: str, key: str) -> Path:
    return config.cache.matrix_row(version, key)


def load_cached_row(config: Config, version: str, key: str) -> ReleaseRow | None:
    path = _cache_file(config, version, key)
    try:
        row = ReleaseRow.from_json(json.loads(path.read_text()))
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError):
        path.unlink(missing_ok=True)  # an unreadable entry is recomputed
        return None
    row.cached = True
    return row


def store_row(config: Config, key: str, row: ReleaseRow) -> None:
    path = _cache_file(config, row.version, key)
    path.parent.mkdir(parents=True, exist_ok=True)
    for old in path.parent.glob(f"{row.version}-*.json"):
        old.unlink(missing_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(row.to_json(), indent=1, sort_keys=True) + "\n")
    tmp.replace(path)


# --- applying the series without a work tree -----------------------------------------


class Scratch:
    """A temporary index and object directory on top of the cached repository."""

    def __init__(self, repo: Path, directory: Path) -> None:
        self.repo = repo
        self.directory = directory
        (directory / "objects").mkdir(parents=True)
        self.index = directory / "index"
        self.env = git_env(
            {
                "GIT_DIR": str(repo),
                "GIT_INDEX_FILE": str(self.index),
                "GIT_OBJECT_DIRECTORY": str(directory / "objects"),
                "GIT_ALTERNATE_OBJECT_DIRECTORIES": str(repo / "objects"),
            },
            isolated=True,
        )

    def git(self, *args: str | os.PathLike[str], check: bool = True):
        return run_git(list(args), env=self.env, cwd=self.directory, check=check)

    def read_tree(self, rev: str) -> None:
        self.git("read-tree", rev)

    def write_tree(self) -> str:
        return git_out(["write-tree"], env=self.env, cwd=self.directory)

    def paths(self) -> list[str]:
        out = run_git(["ls-files", "-z"], env=self.env, cwd=self.directory).stdout
        return [p for p in out.decode(errors="surrogateescape").split("\0") if p]

    def apply(self, patch: Path) -> tuple[str, str]:
        """Apply one patch to the index: (result, detail); a failure leaves it unchanged.

        A patch to a file the release moved (git apply has no rename detection)
        is applied again to the file's new place, when exactly one file of the
        release has the same name.
        """
        backup = self.directory / "index.before"
        shutil.copyfile(self.index, backup)
        before = self.write_tree()
        result, detail, missing = self._apply(patch)
        if result == P_FAILED and missing:
            moves = find_moves(missing, self.paths())
            if moves:
                moved = self.directory / "moved.patch"
                moved.write_bytes(retarget(patch.read_bytes(), moves))
                result, detail, _ = self._apply(moved)
                if result != P_FAILED:
                    where = ", ".join(f"{a} -> {b}" for a, b in sorted(moves.items()))
                    detail += f", followed moved file(s): {where}"
        if result == P_FAILED:
            shutil.copyfile(backup, self.index)
        elif self.write_tree() == before:
            result, detail = P_EMPTY, "upstream already has the same edit"
        return result, detail

    def _apply(self, patch: Path) -> tuple[str, str, list[str]]:
        clean = self.git("apply", "--cached", "--check", patch, check=False).returncode == 0
        proc = self.git("apply", "--cached", "--3way", patch, check=False)
        if proc.returncode != 0:
            stderr = proc.stderr.decode(errors="replace")
            missing = re.findall(r"^error: (.+): does not exist in index$", stderr, re.MULTILINE)
            # A failed --3way can leave unmerged entries: start the retry from the backup.
            shutil.copyfile(self.directory / "index.before", self.index)
            return P_FAILED, _failure_detail(stderr), missing
        return P_APPLIED, "clean" if clean else "3-way merge", []


def find_moves(missing: list[str], paths: list[str]) -> dict[str, str]:
    """old path -> new path for missing files whose name is unique in the release."""
    by_name: dict[str, list[str]] = {}
    for path in paths:
        by_name.setdefault(path.rsplit("/", 1)[-1], []).append(path)
    moves = {}
    for old in missing:
        candidates = by_name.get(old.rsplit("/", 1)[-1], [])
        if len(candidates) == 1:
            moves[old] = candidates[0]
    return moves


def retarget(patch: bytes, moves: dict[str, str]) -> bytes:
    """The patch with its file headers pointing at the moved paths."""
    out = []
    for line in patch.split(b"\n"):
        text = line.decode(errors="surrogateescape")
        for old, new in moves.items():
            if text == f"diff --git a/{old} b/{old}":
                text = f"diff --git a/{new} b/{new}"
            elif text in (f"--- a/{old}", f"+++ b/{old}"):
                text = text[:6] + new
        out.append(text.encode(errors="surrogateescape"))
    return b"\n".join(out)


def _failure_detail(stderr: str) -> str:
    files: list[str] = []
    for pattern in (
        r"^Applied patch to '(.+)' with conflicts\.$",
        r"^error: (.+): does not exist in index$",
        r"^error: (.+): patch does not apply$",
        r"^error: (.+): already exists in index$",
    ):
        for match in re.finditer(pattern, stderr, re.MULTILINE):
            if match.group(1) not in files:
                files.append(match.group(1))
    if files:
        return "conflicts in " + ", ".join(files)
    lines = [ln for ln in stderr.strip().splitlines() if ln]
    return lines[-1] if lines else "git apply failed"


@contextmanager
def scratch(config: Config) -> Iterator[Scratch]:
    """A scratch area over the cached repository, removed afterwards."""
    # Not in <cache>/tmp: taking the cache lock empties that directory.
    directory = Path(tempfile.mkdtemp(prefix="vllm-fork-matrix-"))
    try:
        yield Scratch(config.upstream_repo, directory)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def prime(work: Scratch, series: Series, base_tag: str) -> None:
    """Apply the series to its own base once, so that every blob a patch's
    ``index`` line names exists and ``--3way`` can use it on other releases."""
    work.read_tree(base_tag)
    for patch in series.patches:
        proc = work.git("apply", "--cached", patch, check=False)
        if proc.returncode != 0:
            raise SeriesError(
                f"{patch.name} does not apply to {base_tag}, the series' own base: "
                + proc.stderr.decode(errors="replace").strip()
            )


# --- one release -------------------------------------------------------------------


def compute_row(work: Scratch, version: str, sdist_sha256: str, series: Series) -> ReleaseRow:
    tag = tag_for(version)
    findings = probe_all(GitTree(work.repo, tag))
    row = ReleaseRow(version, sdist_sha256)
    work.read_tree(tag)
    for patch, header in zip(series.patches, series.headers, strict=True):
        finding = findings.get(header.change)
        if header.part == PART_CHANGE and finding is not None and finding.state == "present":
            result, detail = P_ABSORBED, f"upstream has it: {finding.reason}"
        else:
            result, detail = work.apply(patch)
        row.patches.append(PatchResult(patch.name, header.change, header.part, result, detail))
    for change in registry.change_ids():
        finding = findings[change]
        mine = [p for p in row.patches if p.change == change]
        names = [p.file for p in mine]
        state = decide(
            finding.state,
            [p.part for p in mine],
            failed=any(p.result == P_FAILED for p in mine),
        )
        hardening = registry.get(change).scoped_hardening(row.version, dict(finding.hardening))
        row.changes[change] = ChangeCell(state, finding.reason, hardening, names)
    return row


def compute_matrix(
    config: Workspace,
    releases: list[str] | None = None,
    series_version: str | None = None,
    *,
    own: bool = False,
    use_cache: bool = True,
    log: Log = lambda _line: None,
    fetcher: Fetcher | None = None,
) -> Matrix:
    """The matrix of ``releases``: ``own``, each release with its own series
    (none where it has no ``series/<V>/``); else the series of
    ``series_version`` (default: the default base's) applied to every one."""
    pins = config.pins
    series_base = pins.get(series_version)
    series = config.series(series_base.version)
    versions = select_releases(pins, releases)
    series_sha = series_hash(series)
    code_sha = code_hash()
    rows: list[ReleaseRow] = []
    with scratch(config) as work:
        primed = False
        for version in versions:
            base = pins.get(version)
            applied = config.series(version) if own else series
            applied_sha = series_hash(applied) if own else series_sha
            key = row_key(base.sdist.sha256, applied_sha, code_sha)
            row = load_cached_row(config, version, key) if use_cache else None
            if row is None:
                try:
                    # ensure_upstream takes the cache lock while it imports; the rest only
                    # reads the cache, so other commands do not wait for the whole matrix
                    fetcher = fetcher or config.fetcher
                    if not primed and not own:
                        ensure_upstream(config, series_base, fetcher)
                        prime(work, series, tag_for(series_base.version))
                        primed = True
                    log(f"matrix: {version}: checking")
                    ensure_upstream(config, base, fetcher)
                    row = compute_row(work, version, base.sdist.sha256, applied)
                    if applied.patches:
                        row.series_base = version if own else series_base.version
                    store_row(config, key, row)
                except SeriesError:
                    raise
                except ForkError as exc:
                    row = ReleaseRow(version, base.sdist.sha256, error=str(exc))
            rows.append(row)
    return Matrix(
        series_base.version,
        series_sha,
        [p.name for p in series.patches],
        list(registry.change_ids()),
        rows,
        own,
    )


# --- output ------------------------------------------------------------------------


def _series_cell(row: ReleaseRow) -> str:
    if row.error is not None:
        return "unavailable (see below)"
    failed = [p.file for p in row.patches if p.result == P_FAILED]
    absorbed = sum(p.result == P_ABSORBED for p in row.patches)
    note = f" ({absorbed} absorbed)" if absorbed else ""
    if failed:
        return f"no: {len(failed)} of {len(row.patches)} fail (below){note}"
    return f"yes{note}"


def format_matrix(matrix: Matrix, extra: Mapping[str, Mapping[str, str]] | None = None) -> str:
    """The matrix as a Markdown table, one short row per release; the patches
    that fail are listed below it. ``extra``: more columns, name -> release ->
    cell (``-`` where a release has none)."""
    extra = extra or {}
    if matrix.own:
        title = "Each release's own series (`--series V` applies one series to every release)"
        heads = ["series", "series applies"]
    else:
        title = (
            f"Series: series/{matrix.series_version} ({len(matrix.series_patches)} patch(es), "
            f"sha256 {matrix.series_hash[:12]}) applied to every release"
        )
        heads = ["series applies"]
    heads += list(extra)
    lines = [
        title,
        "",
        "| release | " + " | ".join([*matrix.changes, *heads]) + " |",
        "|---|" + "---|" * (len(matrix.changes) + len(heads)),
    ]
    for row in matrix.rows:
        if row.error is not None:
            cells = ["?"] * len(matrix.changes)
        else:
            cells = [row.changes[c].state for c in matrix.changes]
        if matrix.own and not row.series_base and row.error is None:
            cells += ["none", "-"]
        else:
            if matrix.own:
                cells.append(f"{len(row.patches)} patch(es)" if row.error is None else "?")
            cells.append(_series_cell(row))
        cells += [column.get(row.version, "-") for column in extra.values()]
        lines.append(f"| {row.version} | " + " | ".join(cells) + " |")
    failing = [
        (row.version, [p.file for p in row.patches if p.result == P_FAILED])
        for row in matrix.rows
        if row.error is None
    ]
    failing = [(version, names) for version, names in failing if names]
    if failing:
        lines.append("")
        lines += [f"{version}: does not apply: {', '.join(names)}" for version, names in failing]
    unavailable = [row for row in matrix.rows if row.error is not None]
    if unavailable:
        lines.append("")
        lines += [f"{row.version}: {row.error}" for row in unavailable]
    lines += ["", *LEGEND.splitlines()]
    return "\n".join(lines)
