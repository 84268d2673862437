"""The known-issue register agrees with itself: "fixed upstream" comes from the
probes, and a declared ``upstream_fix`` is checked against them.

Every report that says an entry is fixed upstream on a release (status, the
drift table, the README table) asks :func:`pristine_fixed`, which runs the
entry's ``fixed`` probe on upstream's own tree of that release. The declared
``upstream_fix`` is what the probes must agree with (:func:`check_upstream_fix`):
on every pinned release in the cache whose upstream tree has the affected code,
the fix is found exactly from that release on. A disagreement is a
configuration error naming the entry, the release and what the probe saw.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from packaging.version import Version

from vllm_fork.errors import ConfigError
from vllm_fork.facts.known_issues import IssueState, KnownIssue
from vllm_fork.facts.names import tag_for
from vllm_fork.reports.status import SHORT, base_issue_states
from vllm_fork.sources.upstream import imported_sha256
from vllm_fork.sources.workspace import Workspace
from vllm_fork.sourcetree import GitTree

log = logging.getLogger(__name__)


def cached_versions(config: Workspace) -> list[str]:
    """The pinned releases whose upstream tree is in the cache (oldest first)."""
    return [
        v
        for v in config.pins.versions()
        if imported_sha256(config.upstream_repo, v) == config.base(v).sdist.sha256
    ]


@functools.lru_cache(maxsize=256)
def _pristine(repo: str, version: str) -> GitTree:
    return GitTree(Path(repo), tag_for(version))


def pristine_fixed(config: Workspace, version: str) -> frozenset[str]:
    """The register's entries whose fix upstream's own tree of ``version`` has."""
    tree = _pristine(str(config.upstream_repo), version)
    return frozenset(
        i.id for i in config.known_issues if i.fixed is not None and i.fixed.check(tree)[0]
    )


def upstream_fix_problems(
    config: Workspace, issues: Sequence[KnownIssue], versions: Iterable[str]
) -> list[str]:
    """Where a declared ``upstream_fix`` disagrees with the probes on ``versions``."""
    problems = []
    for version in versions:
        tree = _pristine(str(config.upstream_repo), version)
        for issue in issues:
            if issue.upstream_fix is None or issue.fixed is None:
                continue
            if not issue.affected.check(tree)[0] and not issue.fixed.check(tree)[0]:
                continue  # the code is absent upstream (or only the fork adds it)
            found, why = issue.fixed.check(tree)
            declared = Version(version) >= Version(issue.upstream_fix)
            if found != declared:
                problems.append(
                    f"{config.known_issues_file.name}: {issue.id}: upstream_fix = "
                    f'"{issue.upstream_fix}", but upstream {version} '
                    + ("already has the fix" if found else "lacks the fix")
                    + f" by its 'fixed' probe ({why})"
                )
    return problems


def check_upstream_fix(config: Workspace, versions: Iterable[str] | None = None) -> None:
    """ConfigError naming the first entry whose ``upstream_fix`` the probes contradict."""
    problems = upstream_fix_problems(
        config, config.known_issues, cached_versions(config) if versions is None else versions
    )
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise ConfigError(problems[0] + more)


@dataclass
class IssueRow:
    issue: str
    states: dict[str, IssueState]  # base -> state


def issue_rows(config: Workspace, ids: Sequence[str] = ()) -> tuple[list[IssueRow], list[str]]:
    """Each entry (``ids``: those only) on every pinned base in the cache, and the
    bases not in the cache. The ``upstream_fix`` check runs first."""
    known = {i.id for i in config.known_issues}
    unknown = [i for i in ids if i not in known]
    if unknown:
        raise ConfigError(
            f"{config.known_issues_file.name} has no entry {', '.join(map(repr, unknown))}"
        )
    versions = cached_versions(config)
    missing = [v for v in config.pins.versions() if v not in versions]
    wanted = [i for i in config.known_issues if not ids or i.id in ids]
    problems = upstream_fix_problems(config, wanted, versions)
    if problems:
        raise ConfigError(
            problems[0] + (f" (and {len(problems) - 1} more)" if problems[1:] else "")
        )
    rows = {i.id: IssueRow(i.id, {}) for i in wanted}
    for version in versions:
        for state in base_issue_states(config, version):
            if state.issue in rows:
                rows[state.issue].states[version] = state
    return list(rows.values()), missing


def format_issue_rows(rows: list[IssueRow], missing: list[str], *, reasons: bool) -> str:
    versions = sorted({v for r in rows for v in r.states}, key=Version)
    lines = [
        "| known issue | " + " | ".join(versions) + " |",
        "|---|" + "---|" * len(versions),
    ]
    for row in rows:
        cells = [SHORT[row.states[v].state] if v in row.states else "?" for v in versions]
        lines.append(f"| `{row.issue}` | " + " | ".join(cells) + " |")
    if reasons:
        for row in rows:
            lines.append("")
            lines.append(f"{row.issue}:")
            for version in versions:
                state = row.states[version]
                lines.append(f"  {version}: {state.state}: {state.reason}")
    for version in missing:
        lines.append(f"not in the cache (not probed): {version} (vllm-fork fetch --base {version})")
    return "\n".join(lines)
