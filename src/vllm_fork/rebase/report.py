"""What a rebase tells the user: the report of a stop on a conflict, and the
summary table of what became of each patch."""

from __future__ import annotations

import shlex
from pathlib import Path

from vllm_fork.errors import ForkError
from vllm_fork.rebase.conflicts import FileConflict, format_conflicts
from vllm_fork.rebase.state import ABSORBED, SKIPPED, RebaseState
from vllm_fork.series.patches import parse_patch, read_series_file


def _arg(tree: Path | None) -> str:
    """``tree`` as a shell argument of the commands the messages propose."""
    return shlex.quote(str(tree))


def _old_series_names(series_dir: Path) -> dict[str, str]:
    """subject -> patch file name of the old series (for the report and the trailers)."""
    names: dict[str, str] = {}
    try:
        files = read_series_file(series_dir)
    except ForkError:
        return names
    for name in files:
        path = series_dir / name
        if path.is_file():
            try:
                names.setdefault(parse_patch(path).subject, name)
            except ForkError:
                continue
    return names


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
