"""`vllm-fork status`: where each change stands for a base and its series.

The series is applied without a work tree, exactly (``git apply --cached``
into a temporary index of the cached repository, tree/apply.py), and the
resulting tree is what the probes read.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.version import Version

from vllm_fork.atomic import write_json_atomic
from vllm_fork.errors import ForkError, PatchFailedError, UsageError
from vllm_fork.facts import registry
from vllm_fork.facts.finding import UNPROBED
from vllm_fork.facts.known_issues import (
    AFFECTED,
    FIXED_FORK,
    FIXED_UPSTREAM,
    FIXES_TRAILER,
    MITIGATED,
    NOT_AFFECTED,
    IssueState,
)
from vllm_fork.facts.lifecycle import PatchLife, Retirement, retirement
from vllm_fork.facts.names import tag_for
from vllm_fork.facts.state import CARRIED, MISSING, NA, NA_LOCAL, UPSTREAM, decide
from vllm_fork.git import run_git
from vllm_fork.hashing import sha256_bytes
from vllm_fork.probes import DirTree, Finding, GitTree, SourceTree, probe_all
from vllm_fork.probes.issues import known_issue_states, series_fixes
from vllm_fork.probes.rocm_pins import aiter_pin
from vllm_fork.reports.matrix import code_hash
from vllm_fork.series.patches import BUILD_ANY, BUILD_FULL, Series
from vllm_fork.sources.fetch import Fetcher
from vllm_fork.sources.pins import Base, Pins
from vllm_fork.sources.upstream import (
    ensure_upstream,
    in_cache,
    not_cached_reason,
)
from vllm_fork.sources.workspace import Workspace
from vllm_fork.tree.apply import ApplyError, SeriesApplyError, applier, repo_of, tree_of
from vllm_fork.tree.commits import series_commits, tree_base

__all__ = ["CARRIED", "MISSING", "NA", "UPSTREAM", "compute_status", "format_status"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ChangeStatus:
    change: str
    state: str
    reason: str
    patches: tuple[str, ...]
    hardening: dict[str, bool]
    # every patch carrying it is marked ``Fork-Build: full``: a precompiled wheel lacks it
    full_build_only: bool = False
    # some, not all, of its patches are ``Fork-Build: full``: what a precompiled
    # wheel, which leaves them out, has of the change (the probe of the series
    # less those patches)
    precompiled: Precompiled | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "reason": self.reason,
            "patches": list(self.patches),
            "hardening": dict(self.hardening),
            "full_build_only": self.full_build_only,
            "precompiled": self.precompiled.to_json() if self.precompiled else None,
        }


@dataclass(frozen=True)
class Precompiled:
    """A change of which a precompiled build leaves some patches out."""

    state: str
    reason: str
    left_out: tuple[str, ...]  # its patches marked ``Fork-Build: full``
    hardening: dict[str, bool]

    def to_json(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "reason": self.reason,
            "left_out": list(self.left_out),
            "hardening": dict(self.hardening),
        }


@dataclass(frozen=True)
class StatusReport:
    version: str
    patches: tuple[str, ...]
    changes: tuple[ChangeStatus, ...]
    aiter: str | None = None
    lifecycle: tuple[PatchLife, ...] = ()
    releases_probed: tuple[str, ...] = ()  # newer pinned releases searched for retirement
    # newer pinned releases the search needed but could not probe: release -> why
    not_probed: dict[str, str] = field(default_factory=dict)
    known_issues: tuple[IssueState, ...] = ()  # each entry of known-issues.toml on this base

    def to_json(self) -> dict[str, Any]:
        return {
            "base": self.version,
            "known_issues": {s.issue: s.to_json() for s in self.known_issues},
            "aiter": self.aiter,
            "series": list(self.patches),
            "changes": {c.change: c.to_json() for c in self.changes},
            "lifecycle": [life.to_json() for life in self.lifecycle],
            "releases_probed": list(self.releases_probed),
            "releases_not_probed": dict(self.not_probed),
        }


def series_tree(repo: Path, tag: str, series: Series) -> str:
    """The tree id of ``tag`` with every patch of ``series`` applied (no checkout)."""
    with applier(repo, prefix="vllm-fork-status-") as work:
        try:
            trees = work.series(tag, list(series.patches))
        except SeriesApplyError as exc:
            raise PatchFailedError(
                f"patch {exc.patch.name} does not apply to {tag}: {exc.stderr}"
            ) from None
        return trees[-1] if trees else tree_of(repo, tag)


def base_issue_states(config: Workspace, version: str) -> tuple[IssueState, ...]:
    """Each known issue on ``version`` with its own series (``series/<version>/``,
    none: the pristine release), read from the cached upstream repository
    without a work tree (fetched first unless offline)."""
    base = config.base(version)
    tag = ensure_upstream(config, base, config.fetcher)
    repo = config.upstream_repo
    pristine = GitTree(repo, tag)
    series = config.series(version)
    patched = GitTree(repo, series_tree(repo, tag, series)) if series.patches else pristine
    return known_issue_states(config, pristine, patched, series_fixes(series))


SHORT = {
    NOT_AFFECTED: "not affected",
    FIXED_UPSTREAM: "upstream",
    FIXED_FORK: "fork",
    MITIGATED: "mitigated",
    AFFECTED: AFFECTED,
}


def format_issue_matrix(
    issues: tuple[str, ...], states: dict[str, tuple[IssueState, ...] | str]
) -> str:
    """One row per known issue, one column per release (the Debian tracker's
    layout); a release that could not be probed shows ``?`` and its reason below."""
    versions = list(states)
    lines = [
        "| known issue | " + " | ".join(versions) + " |",
        "|---|" + "---|" * len(versions),
    ]
    for issue in issues:
        cells = []
        for version in versions:
            got = states[version]
            if isinstance(got, str):
                cells.append("?")
                continue
            cell = next((s for s in got if s.issue == issue), None)
            cells.append(SHORT[cell.state] if cell else "?")
        lines.append(f"| {issue} | " + " | ".join(cells) + " |")
    errors = [f"{v}: {got}" for v, got in states.items() if isinstance(got, str)]
    return "\n".join(lines + ([""] + errors if errors else []))


def classify(
    pristine: Finding, patched: Finding, parts: list[str]
) -> tuple[str, str, dict[str, bool]]:
    """State of one change from its findings on the base and on base + series,
    and the parts of the patches that carry it."""
    state = decide(pristine.state, parts, patched=patched.state)
    if state == NA:
        return state, NA_LOCAL if pristine.state == UNPROBED else pristine.reason, {}
    reason = pristine.reason if state == UPSTREAM else patched.reason
    return state, reason, dict(patched.hardening)


def retire_candidates(pins: Pins, version: str, changes: set[str]) -> list[str]:
    """The pinned releases after ``version`` that the retirement search probes:
    the release the registry names as upstream's first with each change, and
    the newest pinned one (hardening lands whenever upstream gets to it)."""
    newer = sorted((v for v in pins.bases if Version(v) > Version(version)), key=Version)
    if not newer:
        return []
    wanted = {newer[-1]}
    for cid in changes:
        change = registry.find(cid)
        if change and change.upstream_since in newer:
            wanted.add(change.upstream_since)
    return sorted(wanted, key=Version)


def _pristine_findings(config: Workspace, base: Base, fetcher: Fetcher) -> dict[str, Finding]:
    """The probes' findings on pristine upstream ``base``, cached in ``<cache>/probes``
    keyed by the sdist and the probe code (a release's sources never change)."""
    key = sha256_bytes(f"{base.sdist.sha256}\0{code_hash()}".encode())
    path = config.cache.probe_findings(base.version, key)
    if path.is_file():
        try:
            data = json.loads(path.read_text())
            return {change: Finding.from_json(value) for change, value in data.items()}
        except (ValueError, TypeError):
            log.debug("ignoring the unreadable probe cache %s", path)
    tag = ensure_upstream(config, base, fetcher)
    findings = probe_all(GitTree(config.upstream_repo, tag))
    write_json_atomic(path, {c: f.to_json() for c, f in findings.items()})
    return findings


def patch_lifecycle(
    config: Workspace,
    version: str,
    patches: list[tuple[str, str, str]],
    fetcher: Fetcher,
    *,
    fetch: bool = False,
) -> tuple[tuple[PatchLife, ...], tuple[str, ...], dict[str, str]]:
    """Per patch (name, change, part): carried, or retire-ready with the first
    candidate upstream release after ``version`` (``retire_candidates``) whose
    pristine tree the probe finds it in; the releases probed; and the
    candidates that could not be probed, with why. Only what the cache holds
    is probed: a candidate that is not in it is fetched only with ``fetch``
    (`status --fetch`; never offline), else named as not covered."""
    pins = config.pins
    newer = retire_candidates(pins, version, {change for _, change, _ in patches})
    found: dict[int, Retirement] = {}
    probed: list[str] = []
    not_probed: dict[str, str] = {}
    for release in newer:
        base = pins.get(release)
        if not in_cache(config, base) and (config.offline or not fetch):
            not_probed[release] = (
                f"offline and not in the cache (`vllm-fork fetch --base {release}`)"
                if config.offline
                else not_cached_reason(release)
            )
            continue
        try:
            findings = _pristine_findings(config, base, fetcher)
        except ForkError as exc:
            log.warning("status: upstream %s not probed for retirement: %s", release, exc)
            not_probed[release] = str(exc).splitlines()[0]
            continue
        probed.append(release)
        for i, (_, change, part) in enumerate(patches):
            finding = findings.get(change)
            if i in found or finding is None:
                continue
            hit = retirement(
                change, part, finding.state, finding.reason, finding.hardening, release
            )
            if hit is not None:
                found[i] = hit
    lives = tuple(
        PatchLife(name, change, part, found.get(i))
        for i, (name, change, part) in enumerate(patches)
    )
    return lives, tuple(probed), not_probed


def _precompiled_findings(
    config: Workspace, tag: str, series: Series, tree: Path | None, full: set[str]
) -> dict[str, Finding]:
    """The probes' findings on what a precompiled build is made from: the base
    with every patch but those marked ``Fork-Build: full`` (of the work tree's
    commits when ``tree`` is given, else of the series files)."""
    if tree is None:
        return probe_all(
            GitTree(
                config.upstream_repo, series_tree(config.upstream_repo, tag, series.without(full))
            )
        )
    with applier(repo_of(tree), prefix="vllm-fork-status-") as work:
        patched = tree_of(work.repo, tag)
        work.git("read-tree", patched)
        for commit in series_commits(tree, tag):
            if commit.subject in full:
                continue
            diff = run_git(
                ["diff-tree", "-p", "--binary", commit.parent, commit.sha], cwd=tree
            ).stdout
            try:
                patched = work.exact(None, diff)
            except ApplyError as exc:
                raise PatchFailedError(
                    f"{commit.subject} does not apply without the full-build-only patches: "
                    f"{exc.stderr}"
                ) from None
        return probe_all(GitTree(tree, patched))


def compute_status(
    config: Workspace, version: str | None, tree: Path | None = None, *, fetch: bool = False
) -> StatusReport:
    """Status of base + series, or of a materialized work tree on disk (``tree``).
    The base itself is fetched when it is not in the cache (the report is of it);
    the newer releases the retirement search probes are read from the cache
    only, unless ``fetch`` (those not covered are named in the report)."""
    if tree is not None:
        recorded = tree_base(tree)
        if version is not None and version != recorded:
            raise UsageError(f"{tree} is a work tree of {recorded}, not {version}")
        version = recorded
    base = config.base(version)
    series = config.series(base.version)
    config.known_issues  # noqa: B018 - a malformed register fails before any work
    fetcher = config.fetcher
    tag = ensure_upstream(config, base, fetcher)
    repo = config.upstream_repo
    pristine_tree = GitTree(repo, tag)
    pristine = _pristine_findings(config, base, fetcher)
    aiter = aiter_pin(pristine_tree)
    if tree is not None:
        patched_tree: SourceTree = DirTree(tree)
        patched = probe_all(patched_tree)
        aiter = aiter_pin(patched_tree)
        commits = series_commits(tree, tag)
        names = tuple(c.subject for c in commits)
        # (name, change, part, Fork-Build) of each patch, as committed in the tree
        patches = [
            (c.subject, ch, c.part, c.get("Fork-Build") or BUILD_ANY)
            for c in commits
            for ch in c.values("Fork-Change")
        ]
        fixes = [(c.subject, c.values(FIXES_TRAILER)) for c in commits]
    else:
        patched_tree = (
            GitTree(repo, series_tree(repo, tag, series)) if series.patches else pristine_tree
        )
        patched = probe_all(patched_tree) if series.patches else pristine
        names = tuple(p.name for p in series.patches)
        fixes = series_fixes(series)
        patches = [
            (p.name, h.change, h.part, h.build)
            for p, h in zip(series.patches, series.headers, strict=True)
        ]
    full_names = {name for name, _, _, build in patches if build == BUILD_FULL}
    mixed = {
        change
        for _, change, _, _ in patches
        if {build for _, c, _, build in patches if c == change} == {BUILD_ANY, BUILD_FULL}
    }
    precompiled = _precompiled_findings(config, tag, series, tree, full_names) if mixed else patched
    changes = []
    for change in registry.change_ids():
        mine = [(name, part, build) for name, c, part, build in patches if c == change]
        state, reason, hardening = classify(
            pristine[change], patched[change], [part for _, part, _ in mine]
        )
        scope = registry.get(change)
        hardening = scope.scoped_hardening(base.version, hardening)
        full_only = bool(mine) and all(build == BUILD_FULL for _, _, build in mine)
        partial = None
        if change in mixed:
            kept = [part for _, part, build in mine if build != BUILD_FULL]
            pre_state, pre_reason, pre_hardening = classify(
                pristine[change], precompiled[change], kept
            )
            pre_hardening = scope.scoped_hardening(base.version, pre_hardening)
            left_out = tuple(name for name, _, build in mine if build == BUILD_FULL)
            partial = Precompiled(pre_state, pre_reason, left_out, pre_hardening)
        changes.append(
            ChangeStatus(
                change,
                state,
                reason,
                tuple(name for name, _, _ in mine),
                hardening,
                full_only,
                partial,
            )
        )
    lives, probed, not_probed = patch_lifecycle(
        config, base.version, [(n, c, p) for n, c, p, _ in patches], fetcher, fetch=fetch
    )
    issues = known_issue_states(config, pristine_tree, patched_tree, fixes)
    return StatusReport(
        base.version, names, tuple(changes), aiter, lives, probed, not_probed, issues
    )


def _hardening_count(hardening: dict[str, bool]) -> str:
    """`` [hardening found/applicable]``, or nothing when no item applies."""
    if not hardening:
        return ""
    return f" [hardening {sum(hardening.values())}/{len(hardening)}]"


def format_known_issues(states: tuple[IssueState, ...]) -> list[str]:
    """The known-issue lines of status (nothing when the register is empty)."""
    if not states:
        return []
    width = max(len(s.issue) for s in states)
    lines = ["", "known issues (known-issues.toml):"]
    for s in states:
        lines.append(f"  {s.issue:<{width}}  {s.state:<14}  {s.reason}")
        lines.extend(f"  {'':<{width}}  {'':<14}  <- {patch}" for patch in s.patches)
    return lines


def format_status(report: StatusReport) -> str:
    lines = [f"vLLM {report.version} + {len(report.patches)} patch(es) ({tag_for(report.version)})"]
    lines.append(f"  AITER pinned by docker/Dockerfile.rocm_base: {report.aiter or 'none'}")
    width = max(len(c.change) for c in report.changes) if report.changes else 0
    for c in report.changes:
        line = f"  {c.change:<{width}}  {c.state:<8}  {c.reason}"
        line += _hardening_count(c.hardening)
        lines.append(line)
        if c.full_build_only:
            lines.append(
                f"  {'':<{width}}  {'':<8}  full build only (Fork-Build: full): "
                "a precompiled wheel lacks it"
            )
        if c.precompiled:
            pre = c.precompiled
            line = (
                f"  {'':<{width}}  {'':<8}  precompiled wheel (leaves out "
                f"{', '.join(pre.left_out)}: Fork-Build: full): {pre.state}, {pre.reason}"
            )
            line += _hardening_count(pre.hardening)
            lines.append(line)
        for patch in c.patches:
            lines.append(f"  {'':<{width}}  {'':<8}  <- {patch}")
    if report.lifecycle:
        if report.releases_probed:
            searched = f"retirement probed in upstream {', '.join(report.releases_probed)}"
        elif report.not_probed:
            searched = "retirement not probed"
        else:
            searched = "no newer release pinned to probe for retirement"
        lines += ["", f"patches ({searched}):"]
        for release, why in report.not_probed.items():
            lines.append(f"  not probed: upstream {release}: {why}")
        # without every candidate probed, "carried" may be a patch upstream already has
        unsure = " (not probed)" if report.not_probed else ""
        for life in report.lifecycle:
            state = life.state + (unsure if not life.retire else "")
            lines.append(f"  {state:<12}  {life.patch}  [{life.change}, {life.part}]")
            if life.retire:
                lines.append(f"  {'':<12}    {life.retire.evidence()}")
            elif life.retire_when:
                lines.append(f"  {'':<12}    retires: {life.retire_when}")
    lines += format_known_issues(report.known_issues)
    return "\n".join(lines)
