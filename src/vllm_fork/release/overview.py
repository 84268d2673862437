"""`vllm-fork matrix`: the overview of every release in one place: whether each
series applies and each change's state (reports/matrix.py), the last release
check of each base (release/check.py), each known issue's state with the base's
own series, and the drift of every logical patch across the bases."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm_fork.atomic import write_json_atomic
from vllm_fork.errors import ForkError, SeriesError
from vllm_fork.facts.known_issues import IssueState
from vllm_fork.release.check import format_last_checks, last_checks
from vllm_fork.reports.drift import DriftTable, compute_drift, format_drift
from vllm_fork.reports.matrix import Matrix, compute_matrix, format_matrix
from vllm_fork.reports.status import base_issue_states, format_issue_matrix
from vllm_fork.sources.upstream import in_cache, not_cached_reason
from vllm_fork.sources.workspace import Workspace

# Per release, its known-issue states, or why they were not probed.
IssueStates = dict[str, "tuple[IssueState, ...] | str"]


@dataclass
class Overview:
    matrix: Matrix
    last_checks: dict[str, dict[str, Any] | None]
    last_checks_table: str
    issue_ids: tuple[str, ...]
    issues: IssueStates
    drift: DriftTable

    @property
    def versions(self) -> list[str]:
        return [row.version for row in self.matrix.rows]

    def format(self) -> str:
        parts = [
            format_matrix(self.matrix),
            "\nOwn series and last release check (`vllm-fork release-check`):\n",
            self.last_checks_table,
        ]
        if self.issue_ids:
            parts += [
                "\nKnown issues, each release with its own series (known-issues.toml):\n",
                format_issue_matrix(self.issue_ids, self.issues),
            ]
        parts += [
            "\nDrift: each logical patch on each base against its newest copy "
            "(`vllm-fork status --drift`):\n",
            format_drift(self.drift),
        ]
        return "\n".join(parts)

    def to_json(self) -> dict[str, Any]:
        data = self.matrix.to_json()
        data["drift"] = self.drift.to_json()
        data["release_check"] = self.last_checks
        data["known_issues"] = {
            v: got if isinstance(got, str) else {s.issue: s.to_json() for s in got}
            for v, got in self.issues.items()
        }
        return data

    def write_json(self, path: Path) -> None:
        write_json_atomic(path, self.to_json())


def _issue_states(
    config: Workspace, versions: Sequence[str], log: Callable[[str], None], fetch: bool
) -> IssueStates:
    """Per release, the known-issue states with its own series (or why not: a
    release not in the cache is fetched only with ``fetch``)."""
    out: IssueStates = {}
    if not config.known_issues:
        return out
    for version in versions:
        if not fetch and not in_cache(config, config.base(version)):
            out[version] = not_cached_reason(version)
            continue
        log(f"matrix: {version}: known issues")
        try:
            out[version] = base_issue_states(config, version)
        except SeriesError:
            raise
        except ForkError as exc:
            out[version] = f"not probed: {exc}"
    return out


def compute_overview(
    config: Workspace,
    releases: list[str] | None,
    series: str | None,
    *,
    own: bool,
    use_cache: bool,
    log: Callable[[str], None],
    fetch: bool = False,
) -> Overview:
    """The overview of ``releases`` (default: every pinned release from the oldest
    to the newest supported base) with their own series, or ``series`` applied
    to each (``own`` False), from what the cache holds: a release not in it is
    fetched only with ``fetch``, else named as not covered."""
    matrix = compute_matrix(
        config, releases, series, own=own, use_cache=use_cache, log=log, fetch=fetch
    )
    versions = [row.version for row in matrix.rows]
    checks = last_checks(config)
    return Overview(
        matrix=matrix,
        last_checks={v: checks.get(v) for v in versions},
        last_checks_table=format_last_checks(config, versions),
        issue_ids=tuple(i.id for i in config.known_issues),
        issues=_issue_states(config, versions, log, fetch),
        drift=compute_drift(config, fetch=fetch),
    )
