"""What a rebase tells the user: how each pick went, the report of a stop on
a conflict, and the summary table of what became of each patch."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from vllm_fork.errors import ForkError
from vllm_fork.facts.lifecycle import retirement
from vllm_fork.git import run_git
from vllm_fork.rebase.conflicts import (
    FileConflict,
    describe_conflicts,
    format_conflicts,
    note_added_by_dropped,
)
from vllm_fork.rebase.state import ABSORBED, SKIPPED, RebaseState
from vllm_fork.series.patches import load_series
from vllm_fork.tree.apply import ApplyError, applier, repo_of
from vllm_fork.tree.commits import read_commits


def _arg(tree: Path | None) -> str:
    """``tree`` as a shell argument of the commands the messages propose."""
    return shlex.quote(str(tree))


def _old_series_names(series_dir: Path) -> dict[str, str]:
    """subject -> patch file name of the old series (for the report and the trailers)."""
    names: dict[str, str] = {}
    try:
        series = load_series(series_dir, validate=False)
    except ForkError:
        return names
    for header in series.headers:
        names.setdefault(header.subject, header.file)
    return names


def pick_detail(tree: Path, commit: str, parent: str, new: str) -> str:
    """How a pick went: "clean" when the patch applies exactly, else "3-way merge";
    with the files it followed where upstream moved them."""
    diff = run_git(["diff-tree", "-p", "--binary", "--full-index", f"{commit}^", commit], tree)
    with applier(repo_of(tree), private=True) as work:
        try:
            work.exact(f"{parent}^{{tree}}", diff.stdout)
            detail = "clean"
        except ApplyError:
            detail = "3-way merge"
        gone, came = work.moved(f"{commit}^", commit, parent, new)
    if gone and came:
        detail += f", followed moved file(s): {', '.join(gone)} -> {', '.join(came)}"
    return detail


def describe_stop(
    tree: Path, state: RebaseState, at: int, findings: dict[str, tuple[Any, ...]]
) -> list[FileConflict]:
    """The conflicts git stopped on in patch #``at``; the patch gets the lifecycle
    evidence (``findings``: the probes on upstream V2) when upstream has what it brings."""
    current = state.picks[at]
    found, reason, *rest = findings.get(current.change, ("", ""))
    hit = retirement(
        current.change, current.part, found, reason, rest[0] if rest else None, state.onto_version
    )
    current.retire = hit.to_json() if hit else None
    conflicts = describe_conflicts(tree)
    absorbed = [p for p in state.picks[:at] if p.result == ABSORBED]
    added: dict[str, str] = {}
    for p, c in zip(absorbed, read_commits(tree, [p.commit for p in absorbed]), strict=True):
        for name in c.paths("A"):
            added.setdefault(name, p.subject)
    note_added_by_dropped(conflicts, added, f"upstream {state.onto_version}")
    return conflicts


def conflict_report(
    state: RebaseState, conflicts: list[FileConflict] | None = None, tree: Path | None = None
) -> str:
    """What stopped the replay and the commands that go on (naming ``tree``)."""
    current = state.picks[state.next]
    d = f" {_arg(tree)}" if tree is not None else ""
    if conflicts is None:
        conflicts = [FileConflict.from_json(c) for c in state.conflict]
    lines = [
        f"CONFLICT replaying patch {state.next + 1}/{len(state.picks)} onto upstream "
        f"{state.onto_version}:",
        f"  {current.subject}",
        f"  Fork-Change: {current.change or '?'}  Fork-Part: {current.part or '?'}  "
        f"(commit {current.commit[:12]})",
    ]
    if current.part == "hardening" and any(
        p.change == current.change
        and p.part == "change"
        and p.result == ABSORBED
        and p.detail != SKIPPED  # dropped by hand: upstream need not have it
        for p in state.picks
    ):
        lines.append(
            f"  upstream {state.onto_version} absorbed {current.change}: re-target this "
            "hardening onto upstream's code"
        )
    if current.retire:
        lines.append(
            f"  retire-ready: upstream {current.retire['release']} absorbed {current.change} "
            f"(probe: {current.retire['probe']});"
        )
        lines.append(
            f'  `vllm-fork rebase --skip --reason "absorbed by upstream {state.onto_version}"{d}` '
            "drops this patch"
        )
    lines.append("")
    lines.extend(format_conflicts(conflicts, f"upstream {state.onto_version}"))
    lines += [
        "",
        "Resolve the files above, then `git add` them (or commit) and run "
        f"`vllm-fork rebase --continue{d}`;",
        f"`vllm-fork rebase --skip --reason TEXT{d}` drops this patch (when upstream already "
        "has it; TEXT goes into the review);",
        f"`vllm-fork rebase --abort{d}` puts the work tree back as it was "
        f"(kept in {state.backup_ref}).",
    ]
    return "\n".join(lines)


def summary_table(state: RebaseState, names: dict[str, str] | None = None) -> str:
    names = names or {}
    rows = [("patch", "change", "part", "result")]
    for i, p in enumerate(state.picks, 1):
        label = names.get(p.subject, f"#{i} {p.subject}")
        result = p.result or "pending"
        if p.detail == SKIPPED:
            result = f"dropped by hand ({p.reason or 'reason missing'})"
        elif p.detail:
            result += f" ({p.detail})"
        rows.append((label, p.change, p.part, result))
    widths = [max(len(r[c]) for r in rows) for c in range(3)]
    out = []
    for n, row in enumerate(rows):
        out.append("  ".join(f"{row[c]:<{widths[c]}}" for c in range(3)) + "  " + row[3])
        if n == 0:
            out.append("  ".join("-" * w for w in widths) + "  " + "-" * 6)
    return "\n".join(out)


def old_series_names(state: RebaseState) -> dict[str, str]:
    return _old_series_names(Path(state.old_series_dir))
