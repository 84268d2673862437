"""The drift table: per logical patch, how each base's copy compares with the newest.

A logical patch is named by its ``Fork-Patch`` trailer (the subject when it
has none). For each base, the patch is

- ``newest``: the newest base that carries it (the reference);
- ``same``: the same diff as the newest's (``index`` lines, hunk line
  numbers and the commit message may differ);
- ``adapted``: another diff, summarized in one line (the files, hunks and
  lines that differ);
- absent, with the reason: ``n/a`` (the release lacks the code the change
  modifies: the change registry), ``upstream`` (the release has it: an
  ``Applied-Upstream`` trailer or rebase record, or the registry), ``retired``
  (dropped by hand at a rebase, or its hardening no longer applies),
  ``not affected`` (a hardening or fix patch whose known issues the base
  does not have: the known-issue probes), or ``not carried`` (none of these:
  the base simply has no such patch).
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from difflib import SequenceMatcher
from typing import Any

from packaging.version import Version

from vllm_fork.errors import ForkError
from vllm_fork.facts import registry
from vllm_fork.facts.known_issues import FIXES_TRAILER, NOT_AFFECTED
from vllm_fork.facts.state import PART_CHANGE, PART_FIX, PART_HARDENING
from vllm_fork.reports.register import cached_versions, check_upstream_fix, pristine_fixed
from vllm_fork.reports.status import base_issue_states
from vllm_fork.series import store
from vllm_fork.series.patches import Series, TrailerFields
from vllm_fork.series.store import stem_of
from vllm_fork.sources.upstream import in_cache

log = logging.getLogger(__name__)

ID_TRAILER = "Fork-Patch"
NEWEST = "newest"
SAME = "same"
ADAPTED = "adapted"
NA = "n/a"
UPSTREAM = "upstream"
RETIRED = "retired"
UNAFFECTED = NOT_AFFECTED
NOT_CARRIED = "not carried"
ABSENT = (NA, UPSTREAM, RETIRED, UNAFFECTED, NOT_CARRIED)
SHORT = {
    NEWEST: "newest",
    SAME: "same",
    ADAPTED: "adapt",
    NA: "n/a",
    UPSTREAM: "upstr",
    RETIRED: "retir",
    UNAFFECTED: "unaff",
    NOT_CARRIED: "-",
}
LEGEND = (
    "newest: the newest base carrying the patch (the reference); same: the same diff "
    "(index lines and line numbers aside);\nadapt: another diff (below); absent: n/a (the "
    "release lacks the code), upstr (upstream has it), retir (retired),\nunaff (the "
    "release lacks the bugs it fixes), - (not carried)."
)
_HISTORY = re.compile(
    r"^# (?P<kind>Applied-Upstream|Dropped-By-Hand): (?P<version>\S+) <- (?P<patch>\S+) "
)
_HUNK = re.compile(r"^@@ -\d+(?:,\d+)? \+\d+(?:,\d+)? @@")


def patch_id(header: TrailerFields, subject: str) -> str:
    """A patch's identity across bases: its ``Fork-Patch`` trailer, else its subject."""
    return header.get(ID_TRAILER) or subject


# --- comparing two diffs ---------------------------------------------------------------


def diff_files(text: str) -> dict[str, list[tuple[str, ...]]]:
    """path -> hunks (each its body lines) of a format-patch's diff, with what
    differs between bases for the same change dropped: ``index`` lines, hunk
    line numbers (the ``@@`` line's function context is kept as a line)."""
    start = text.find("\ndiff --git ")
    if start < 0:
        return {}
    body = text[start + 1 :]
    end = body.rfind("\n-- \n")
    if end >= 0:
        body = body[: end + 1]
    files: dict[str, list[list[str]]] = {}
    path = ""
    hunk: list[str] | None = None
    for line in body.splitlines():
        if line.startswith("diff --git "):
            path = line.split(" b/", 1)[-1]
            files[path] = []
            hunk = None
        elif _HUNK.match(line) and path:
            hunk = [_HUNK.sub("@@", line)]
            files[path].append(hunk)
        elif hunk is not None:
            hunk.append(line)
        # else: the file's extended header (index, mode, ---/+++ lines)
    return {p: [tuple(h) for h in hunks] for p, hunks in files.items()}


@dataclass(frozen=True)
class Interdiff:
    files: tuple[str, ...]  # paths whose hunks differ (or that only one side touches)
    hunks: int  # hunks of one side without an equal hunk on the other
    lines: int  # changed (+/-) lines that differ

    @property
    def same(self) -> bool:
        return not self.files

    def summary(self) -> str:
        shown = ", ".join(self.files[:3]) + (", ..." if len(self.files) > 3 else "")
        what = f"{self.lines} changed line(s)" if self.lines else "context lines only"
        return f"{len(self.files)} file(s), {self.hunks} hunk(s) differ, {what}: {shown}"


def interdiff(old: str, new: str) -> Interdiff:
    """How the diff of ``old`` differs from ``new`` (two format-patch texts)."""
    a, b = diff_files(old), diff_files(new)
    files: list[str] = []
    hunks = lines = 0
    for path in sorted(set(a) | set(b)):
        ha, hb = a.get(path, []), b.get(path, [])
        if ha == hb:
            continue
        files.append(path)
        only_a = [h for h in ha if h not in hb]
        only_b = [h for h in hb if h not in ha]
        hunks += max(len(only_a), len(only_b))
        ca = [ln for h in ha for ln in h if ln[:1] in "+-"]
        cb = [ln for h in hb for ln in h if ln[:1] in "+-"]
        matcher = SequenceMatcher(None, ca, cb, autojunk=False)
        lines += sum(
            max(i2 - i1, j2 - j1) for op, i1, i2, j1, j2 in matcher.get_opcodes() if op != "equal"
        )
    return Interdiff(tuple(files), hunks, lines)


# --- the table --------------------------------------------------------------------------


@dataclass(frozen=True)
class Cell:
    state: str
    detail: str = ""  # adapted: the interdiff summary; absent: the reason
    patch: str = ""  # the base's patch file name (carried)

    def to_json(self) -> dict[str, str]:
        out = {"state": self.state}
        if self.detail:
            out["detail"] = self.detail
        if self.patch:
            out["patch"] = self.patch
        return out


@dataclass
class DriftRow:
    id: str
    change: str
    part: str
    newest: str  # the base the others are compared with
    cells: dict[str, Cell] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "change": self.change,
            "part": self.part,
            "newest": self.newest,
            "bases": {v: c.to_json() for v, c in self.cells.items()},
        }


@dataclass
class DriftTable:
    bases: list[str]
    rows: list[DriftRow]
    # bases whose upstream tree is not in the cache (not fetched: no `--fetch`):
    # an absent patch's reason there cannot say "upstream" or "not affected"
    uncovered: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "bases": self.bases,
            "patches": [r.to_json() for r in self.rows],
            "not_covered": list(self.uncovered),
        }

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for row in self.rows:
            for cell in row.cells.values():
                out[cell.state] = out.get(cell.state, 0) + 1
        return out


@dataclass(frozen=True)
class _Copy:
    version: str
    file: str
    text: str
    change: str
    part: str
    applied_upstream: str | None
    fixes: tuple[str, ...] = ()  # its Fork-Fixes: known-issue ids


def _history(series: Series) -> dict[str, tuple[str, str]]:
    """patch stem -> (kind, version) of the series' Applied-Upstream / Dropped-By-Hand lines."""
    out: dict[str, tuple[str, str]] = {}
    for line in series.comments:
        m = _HISTORY.match(line)
        if m:
            out[stem_of(m.group("patch"))] = (m.group("kind"), m.group("version"))
    return out


def _absent_reason(
    version: str,
    copies: list[_Copy],
    stems: set[str],
    histories: Mapping[str, dict[str, tuple[str, str]]],
    versions: list[str],
    fixed_upstream: Callable[[str], Collection[str]] | None,
    unaffected: Callable[[str], Collection[str]] | None = None,
) -> Cell:
    v = Version(version)
    change_id, part = copies[-1].change, copies[-1].part
    change = registry.find(change_id)
    # a rebase record of this base or an earlier one naming a copy of the patch
    for other in versions:
        if Version(other) > v:
            break
        for stem in stems:
            hit = histories.get(other, {}).get(stem)
            if hit and Version(hit[1]) <= v:
                kind, at = hit
                if kind == "Dropped-By-Hand":
                    return Cell(RETIRED, f"dropped by hand at the rebase onto {at}")
                return Cell(UPSTREAM, f"Applied-Upstream: {at} (series/{other} record)")
    marks = sorted(
        (Version(c.applied_upstream), c.applied_upstream)
        for c in copies
        if c.applied_upstream and _is_version(c.applied_upstream)
    )
    if marks and marks[0][0] <= v:
        return Cell(UPSTREAM, f"Applied-Upstream: {marks[0][1]} (patch trailer)")
    if change is not None:
        expected = change.expected_upstream(version)
        if expected == "n/a":
            return Cell(
                NA, f"{change_id}: the code it changes arrives in {change.applies_since} (registry)"
            )
        if expected == "present" and part == PART_CHANGE:
            return Cell(UPSTREAM, f"{change_id}: upstream since {change.upstream_since} (registry)")
        if part == PART_HARDENING and change.hardening_ids and not change.hardening_at(version):
            return Cell(RETIRED, f"{change_id}: no hardening item applies to {version}")
    fixes = sorted({f for c in copies for f in c.fixes})
    if part in (PART_HARDENING, PART_FIX):
        # the fork's own fix of a known bug: upstream has it once upstream's tree
        # has every fix it carries (the register's ``fixed`` probes on the release)
        if fixes and fixed_upstream is not None:
            done = fixed_upstream(version)
            if all(f in done for f in fixes):
                what = ", ".join(f"{f}: fixed upstream" for f in fixes)
                return Cell(UPSTREAM, f"{what} (known-issue probes of upstream {version})")
        # nothing to fix: the release does not have the bugs (the known-issue probes)
        if fixes and unaffected is not None:
            clean = unaffected(version)
            if all(f in clean for f in fixes):
                why = ", ".join(f"{f}: not affected" for f in fixes)
                return Cell(UNAFFECTED, f"{why} (known-issue probes of {version})")
        return Cell(NOT_CARRIED, "")
    if change is not None and change.expected_upstream(version) == "present":
        return Cell(UPSTREAM, f"{change_id}: upstream since {change.upstream_since} (registry)")
    return Cell(NOT_CARRIED, "")


def _is_version(text: str) -> bool:
    try:
        Version(text)
    except ValueError:
        return False
    return True


def drift_table(
    series_by_base: Mapping[str, Series],
    fixed_upstream: Callable[[str], Collection[str]] | None = None,
    unaffected: Callable[[str], Collection[str]] | None = None,
) -> DriftTable:
    """The drift table of the given bases' series (any order; sorted oldest first).
    ``fixed_upstream``: base -> the known issues upstream's tree of it fixes (a
    hardening or fix patch is upstream's only once every bug it fixes is).
    ``unaffected``: base -> the known issues it does not have (asked only for a
    hardening or fix patch the base lacks)."""
    versions = sorted(series_by_base, key=Version)
    copies: dict[str, list[_Copy]] = {}
    order: dict[str, tuple[int, int]] = {}
    stems: dict[str, set[str]] = {}
    histories = {v: _history(series_by_base[v]) for v in versions}
    for rank, version in enumerate(reversed(versions)):
        series = series_by_base[version]
        for pos, (path, header) in enumerate(zip(series.patches, series.headers, strict=True)):
            ident = patch_id(header, header.subject)
            copies.setdefault(ident, []).append(
                _Copy(
                    version,
                    header.file,
                    path.read_text(encoding="utf-8", errors="replace"),
                    header.change,
                    header.part,
                    header.applied_upstream,
                    tuple(header.values(FIXES_TRAILER)),
                )
            )
            order.setdefault(ident, (rank, pos))
            stems.setdefault(ident, set()).add(stem_of(header.file))
    rows: list[DriftRow] = []
    for ident in sorted(copies, key=lambda i: order[i]):
        found = sorted(copies[ident], key=lambda c: Version(c.version))
        newest = found[-1]
        row = DriftRow(ident, newest.change, newest.part, newest.version)
        by_version = {c.version: c for c in found}
        for version in versions:
            copy = by_version.get(version)
            if copy is None:
                row.cells[version] = _absent_reason(
                    version, found, stems[ident], histories, versions, fixed_upstream, unaffected
                )
            elif copy is newest:
                row.cells[version] = Cell(NEWEST, "", copy.file)
            else:
                diff = interdiff(copy.text, newest.text)
                row.cells[version] = (
                    Cell(SAME, "", copy.file)
                    if diff.same
                    else Cell(ADAPTED, diff.summary(), copy.file)
                )
        rows.append(row)
    return DriftTable(versions, rows)


def compute_drift(
    config: Any, versions: Iterable[str] | None = None, *, fetch: bool = False
) -> DriftTable:
    """The drift table of every pinned base with a series (or of ``versions``),
    from the upstream trees in the cache; ``fetch``: a base's tree that is not
    there is fetched for its known-issue probes, else the base is named as not
    covered (:attr:`DriftTable.uncovered`)."""
    wanted = list(versions) if versions else store.versions(config.series_root)
    pinned = set(config.pins.versions())
    cached = set(cached_versions(config))
    check_upstream_fix(config, sorted(cached, key=Version))
    uncovered: set[str] = set()

    def fixed_upstream(version: str) -> frozenset[str]:
        if version not in cached:
            uncovered.add(version)
            return frozenset()
        return pristine_fixed(config, version)

    @functools.cache
    def unaffected(version: str) -> frozenset[str]:
        if not fetch and not in_cache(config, config.base(version)):
            uncovered.add(version)
            return frozenset()
        try:
            states = base_issue_states(config, version)
        except ForkError as e:  # e.g. offline without the upstream repository
            log.warning("%s: known issues not probed (%s); absent fixes shown as '-'", version, e)
            return frozenset()
        return frozenset(s.issue for s in states if s.state == NOT_AFFECTED)

    series = {v: config.series(v) for v in wanted if v in pinned}
    table = drift_table(series, fixed_upstream, unaffected)
    table.uncovered = tuple(sorted(uncovered, key=Version))
    return table


def format_drift(table: DriftTable) -> str:
    """The table (one row per logical patch, one column per base), then the detail
    of every adapted and absent cell."""
    width = min(max((len(r.id) for r in table.rows), default=10), 48)
    cols = [max(len(v), 6) for v in table.bases]
    head = (
        "patch".ljust(width)
        + "  "
        + " ".join(v.rjust(w) for v, w in zip(table.bases, cols, strict=True))
    )
    lines = [head, "-" * len(head)]
    for row in table.rows:
        name = row.id if len(row.id) <= width else row.id[: width - 3] + "..."
        cells = " ".join(
            SHORT[row.cells[v].state].rjust(w) for v, w in zip(table.bases, cols, strict=True)
        )
        lines.append(f"{name.ljust(width)}  {cells}")
    lines += ["", LEGEND, ""]
    counts = table.counts()
    lines.append(
        f"{len(table.rows)} logical patch(es) over {len(table.bases)} base(s): "
        + ", ".join(f"{counts.get(s, 0)} {s}" for s in (NEWEST, SAME, ADAPTED, *ABSENT))
    )
    for row in table.rows:
        details = [f"    {span}: {state}: {detail}" for span, state, detail in _runs(row)]
        if details:
            lines.append(f"  {row.id} ({row.change}, {row.part}; newest {row.newest}):")
            lines.extend(details)
    if table.uncovered:
        lines.append(
            f"not covered: {', '.join(table.uncovered)}: not in the cache, so a patch absent "
            "there is not checked against upstream's fix or the known-issue probes (shown "
            "as '-'); `--fetch` fetches them"
        )
    return "\n".join(lines)


def _runs(row: DriftRow) -> list[tuple[str, str, str]]:
    """Consecutive bases with the same state and detail, as ``first..last`` spans."""
    out: list[tuple[list[str], str, str]] = []
    for version, cell in row.cells.items():
        if out and (out[-1][1], out[-1][2]) == (cell.state, cell.detail):
            out[-1][0].append(version)
        else:
            out.append(([version], cell.state, cell.detail))
    return [
        (v[0] if len(v) == 1 else f"{v[0]}..{v[-1]} ({len(v)})", state, detail)
        for v, state, detail in out
        if detail
    ]
