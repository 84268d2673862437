"""`vllm-fork matrix`: for each pinned release, where each change stands and
whether the series applies: each release's own series (``series/<V>/``,
the default of the command line), or one series projected onto every
release (``--series V``, what a rebase of it would meet).

A release's row comes from its pristine upstream tree in the cached
repository: the probes say whether upstream has each change (or lacks the
code it modifies), and the series is applied the way a rebase would (change
patches upstream absorbed are skipped, everything else is applied by
tree/apply.py: exactly when it applies so, else as a 3-way merge of the
patch's commit on the series' own base, renames followed), into a temporary
index, with new objects in a temporary object directory, so neither a work
tree nor the cache changes.

Rows are cached under ``<cache>/matrix/``, keyed by the release's pinned
sdist sha256, the series content and the code that computes them.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from packaging.version import Version

from vllm_fork import probes
from vllm_fork.aiterpin import aiter_pin
from vllm_fork.atomic import write_json_atomic
from vllm_fork.errors import ForkError, SeriesError, UsageError
from vllm_fork.facts import registry, state
from vllm_fork.facts.finding import UNPROBED
from vllm_fork.facts.names import tag_for
from vllm_fork.facts.state import LEGEND, NA, NA_LOCAL, PART_CHANGE, decide
from vllm_fork.hashing import sha256_bytes
from vllm_fork.probes import GitTree, probe_all
from vllm_fork.series.patches import Series
from vllm_fork.sources.fetch import Fetcher
from vllm_fork.sources.pins import Pins
from vllm_fork.sources.upstream import ensure_upstream, in_cache, not_cached_reason
from vllm_fork.sources.workspace import Workspace
from vllm_fork.tree.apply import (
    CLEAN,
    EMPTY,
    MERGED,
    Applied,
    Applier,
    ApplyError,
    SeriesApplyError,
    applier,
    apply_problems,
    last_line,
    tree_of,
)

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
    # not computed: its upstream tree is not in the cache and the command was not
    # asked to fetch it (``error`` says so); not a failure of the release
    not_covered: bool = False
    series_base: str = ""  # whose series was applied ("" for none: the release has none)
    aiter: str | None = None  # the AITER tag the release's ROCm image pins

    @property
    def series_applies(self) -> bool | None:
        if self.error is not None:
            return None
        return all(p.result != P_FAILED for p in self.patches)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        del data["cached"]
        data["not_covered"] = self.not_covered
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
            aiter=data.get("aiter"),
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
        """The releases whose row could not be computed (not those left out
        because they are not in the cache: :attr:`not_covered`)."""
        return [r.version for r in self.rows if r.error is not None and not r.not_covered]

    @property
    def not_covered(self) -> list[str]:
        return [r.version for r in self.rows if r.not_covered]

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


def _cache_file(config: Workspace, version: str, key: str) -> Path:
    return config.cache.matrix_row(version, key)


def load_cached_row(config: Workspace, version: str, key: str) -> ReleaseRow | None:
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


def store_row(config: Workspace, key: str, row: ReleaseRow) -> None:
    path = _cache_file(config, row.version, key)
    path.parent.mkdir(parents=True, exist_ok=True)
    for old in path.parent.glob(f"{row.version}-*.json"):
        old.unlink(missing_ok=True)
    write_json_atomic(path, row.to_json(), indent=1)


# --- applying the series without a work tree -----------------------------------------


PatchCommit = tuple[str, str] | None  # (tree before, tree after) on the series' own base


def series_commits(work: Applier, series: Series, base_tag: str) -> list[PatchCommit]:
    """Each patch as a commit on the series' own base (the trees before and after
    it), which its 3-way apply onto another release merges; SeriesError when one
    does not apply to its own base."""
    parent = tree_of(work.repo, base_tag)
    try:
        trees = work.series(parent, list(series.patches))
    except SeriesApplyError as exc:
        raise SeriesError(
            f"{exc.patch.name} does not apply to {base_tag}, the series' own base: {exc.stderr}"
        ) from None
    return list(zip([parent, *trees[:-1]], trees, strict=True))


def _failure_detail(stderr: str) -> str:
    """Why a patch with no commit of its own base does not apply (``git apply``'s account)."""
    order = ("conflict", "missing", "fails", "exists")
    problems = sorted(
        (p for p in apply_problems(stderr) if p.kind in order), key=lambda p: order.index(p.kind)
    )
    files = list(dict.fromkeys(p.path for p in problems))
    if files:
        return "conflicts in " + ", ".join(files)
    return last_line(stderr, "git apply failed")


def apply_patch(work: Applier, onto: str, patch: Path, commit: PatchCommit) -> Applied | str:
    """One patch onto tree ``onto`` (tree/apply.py's rules); a failure's detail when the
    patch has no commit to merge (it does not apply to its own base either)."""
    if commit is not None:
        return work.apply(onto, patch, *commit)
    try:
        return Applied(CLEAN, work.exact(onto, patch))
    except ApplyError as exc:
        return _failure_detail(exc.stderr)


# --- one release -------------------------------------------------------------------


def compute_row(
    work: Applier,
    version: str,
    sdist_sha256: str,
    series: Series,
    commits: list[PatchCommit] | None = None,
) -> ReleaseRow:
    """The row of ``version``: the probes' findings on it, and each patch of ``series``
    absorbed or applied (``commits``: its patches on their own base; default: the
    release is the series' own base)."""
    tag = tag_for(version)
    pristine = GitTree(work.repo, tag)
    findings = probe_all(pristine)
    row = ReleaseRow(version, sdist_sha256, aiter=aiter_pin(pristine))
    if commits is None:
        commits = _own_commits(work, series, tag)
    onto = tree_of(work.repo, tag)
    for patch, header, commit in zip(series.patches, series.headers, commits, strict=True):
        finding = findings.get(header.change)
        if header.part == PART_CHANGE and finding is not None and finding.state == "present":
            result, detail = P_ABSORBED, f"upstream has it: {finding.reason}"
        else:
            applied = apply_patch(work, onto, patch, commit)
            if isinstance(applied, str):
                result, detail = P_FAILED, applied
            else:
                result = {CLEAN: P_APPLIED, MERGED: P_APPLIED, EMPTY: P_EMPTY}.get(
                    applied.status, P_FAILED
                )
                detail = applied.detail()
                if applied.ok:
                    onto = applied.tree
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
        reason = NA_LOCAL if state == NA and finding.state == UNPROBED else finding.reason
        row.changes[change] = ChangeCell(state, reason, hardening, names)
    return row


def _own_commits(work: Applier, series: Series, tag: str) -> list[PatchCommit]:
    """The commits of a release's own series on it; None for a patch that does not
    apply (the row then says why)."""
    parent = tree_of(work.repo, tag)
    commits: list[PatchCommit] = []
    for patch in series.patches:
        try:
            tree = work.exact(parent, patch)
        except ApplyError:
            commits.append(None)
            continue
        commits.append((parent, tree))
        parent = tree
    return commits


def compute_matrix(
    config: Workspace,
    releases: list[str] | None = None,
    series_version: str | None = None,
    *,
    own: bool = False,
    use_cache: bool = True,
    log: Log = lambda _line: None,
    fetcher: Fetcher | None = None,
    fetch: bool = True,
) -> Matrix:
    """The matrix of ``releases``: ``own``, each release with its own series
    (none where it has no ``series/<V>/``); else the series of
    ``series_version`` (default: the default base's) applied to every one.
    ``fetch`` False: a release whose row is not cached and whose upstream tree is
    not in the cache is not computed (a row that says so, ``not_covered``)."""
    pins = config.pins
    series_base = pins.get(series_version)
    series = config.series(series_base.version)
    versions = select_releases(pins, releases)
    series_sha = series_hash(series)
    code_sha = code_hash()
    rows: list[ReleaseRow] = []
    # New objects go to a private object directory: the cache does not change.
    with applier(config.upstream_repo, private=True, prefix="vllm-fork-matrix-") as work:
        commits: list[PatchCommit] | None = None
        for version in versions:
            base = pins.get(version)
            applied = config.series(version) if own else series
            applied_sha = series_hash(applied) if own else series_sha
            key = row_key(base.sdist.sha256, applied_sha, code_sha)
            row = load_cached_row(config, version, key) if use_cache else None
            missing = [
                b
                for b in ([base] if own else [series_base, base])
                if not fetch and not in_cache(config, b)
            ]
            if row is None and missing:
                reason = not_cached_reason(missing[0].version)
                if missing[0] is not base:
                    reason = f"the series base {missing[0].version} is {reason}"
                row = ReleaseRow(version, base.sdist.sha256, error=reason, not_covered=True)
            if row is None:
                try:
                    # ensure_upstream takes the cache lock while it imports; the rest only
                    # reads the cache, so other commands do not wait for the whole matrix
                    fetcher = fetcher or config.fetcher
                    if commits is None and not own:
                        ensure_upstream(config, series_base, fetcher)
                        commits = series_commits(work, series, tag_for(series_base.version))
                    log(f"matrix: {version}: checking")
                    ensure_upstream(config, base, fetcher)
                    row = compute_row(work, version, base.sdist.sha256, applied, commits)
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
    if row.not_covered:
        return "not in the cache (see below)"
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
