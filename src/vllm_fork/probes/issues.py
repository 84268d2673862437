"""Each known issue's state on a base: the register's probes run on upstream's
tree and on the tree with the fork's series (status, matrix, release-check and
the release notes of a built wheel all ask the same question here)."""

from __future__ import annotations

from typing import Any

from vllm_fork.errors import SeriesError
from vllm_fork.facts.known_issues import FIXES_TRAILER, IssueState, decide_all, fixing_patches
from vllm_fork.facts.names import tag_for
from vllm_fork.series.patches import Series
from vllm_fork.sources.upstream import imported_sha256
from vllm_fork.sources.workspace import Workspace
from vllm_fork.sourcetree import GitTree, SourceTree


def series_fixes(series: Series) -> list[tuple[str, list[str]]]:
    """(patch name, its ``Fork-Fixes`` values) of every patch of ``series``."""
    return [
        (p.name, h.values(FIXES_TRAILER))
        for p, h in zip(series.patches, series.headers, strict=True)
    ]


def known_issue_states(
    config: Workspace,
    pristine: SourceTree,
    patched: SourceTree,
    fixes: list[tuple[str, list[str]]],
) -> tuple[IssueState, ...]:
    """Each entry of the known-issue register on one base: ``pristine`` is
    upstream's tree, ``patched`` the base with its series, ``fixes`` the
    (patch name, ``Fork-Fixes`` values) of the series' patches."""
    issues = config.known_issues
    known = {issue.id for issue in issues}
    for name, ids in fixes:
        for issue_id in ids:
            if issue_id not in known:
                raise SeriesError(
                    f"{name}: Fork-Fixes names {issue_id!r}, which "
                    f"{config.known_issues_file.name} does not list"
                )
    return decide_all(issues, pristine, patched, fixing_patches(fixes))


def built_issue_states(config: Any, version: str, built: Any) -> dict[str, dict[str, Any]] | None:
    """Each known issue on a built tree (None when the pristine base is not in the
    cache, so "fixed upstream" and "fixed by fork" cannot be told apart)."""
    if imported_sha256(config.upstream_repo, version) is None:
        return None
    fixes = series_fixes(config.series(version))
    pristine = GitTree(config.upstream_repo, f"refs/tags/{tag_for(version)}")
    states = known_issue_states(config, pristine, built, fixes)
    return {s.issue: s.to_json() for s in states}
