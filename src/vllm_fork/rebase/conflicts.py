"""Describe the conflicts a failed 3-way pick left in a work tree.

For each unmerged path: what kind of conflict it is (both changed the
content, one side deleted or renamed the file, ...) and, for content
conflicts, every conflict block with its line range in the work tree file
and a short excerpt of both sides.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from vllm_fork.git import git_env, run_git

EXCERPT_LINES = 3
EXCERPT_WIDTH = 88


@dataclass
class Hunk:
    start: int  # first line of the conflict block (the "<<<<<<<" line), 1-based
    end: int  # last line (the ">>>>>>>" line)
    ours: list[str]  # upstream side (the new base plus the patches already replayed)
    theirs: list[str]  # the patch's side


@dataclass
class FileConflict:
    path: str
    kind: str
    hunks: list[Hunk] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> FileConflict:
        return cls(data["path"], data["kind"], [Hunk(**h) for h in data.get("hunks", [])])


def unmerged_stages(tree: Path) -> dict[str, set[int]]:
    """Unmerged paths of the index, each with the stages it has (1 base, 2 ours, 3 theirs)."""
    out = run_git(["ls-files", "-u", "-z"], cwd=tree, env=git_env(isolated=True)).stdout
    stages: dict[str, set[int]] = {}
    for entry in out.decode(errors="surrogateescape").split("\0"):
        if not entry:
            continue
        meta, _, path = entry.partition("\t")
        stages.setdefault(path, set()).add(int(meta.split()[2]))
    return stages


DELETED_UPSTREAM = "changed by the patch, deleted or moved upstream"


def _kind(stages: set[int], has_markers: bool) -> str:
    if stages == {1, 2, 3} or has_markers:
        return "content"
    if 2 not in stages and 3 in stages:
        return DELETED_UPSTREAM
    if 3 not in stages and 2 in stages:
        return "deleted or moved by the patch, changed upstream"
    if 1 not in stages:
        return "added by both sides"
    return "unmerged"


def parse_markers(text: str) -> list[Hunk]:
    """Conflict blocks of a file written with merge.conflictStyle=diff3 (or merge)."""
    hunks: list[Hunk] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        if not lines[i].startswith("<<<<<<< ") and lines[i] != "<<<<<<<":
            i += 1
            continue
        start = i
        ours: list[str] = []
        theirs: list[str] = []
        section = ours
        i += 1
        while i < len(lines) and not lines[i].startswith(">>>>>>>"):
            line = lines[i]
            if line.startswith("|||||||"):
                section = []  # the merge base: not shown
            elif line == "=======":
                section = theirs
            else:
                section.append(line)
            i += 1
        hunks.append(Hunk(start + 1, min(i, len(lines) - 1) + 1, ours, theirs))
        i += 1
    return hunks


def describe_conflicts(tree: Path) -> list[FileConflict]:
    result: list[FileConflict] = []
    for path, stages in sorted(unmerged_stages(tree).items()):
        file = tree / path
        hunks: list[Hunk] = []
        if file.is_file() and not file.is_symlink():
            hunks = parse_markers(file.read_text(encoding="utf-8", errors="replace"))
        result.append(FileConflict(path, _kind(stages, bool(hunks)), hunks))
    return result


def note_added_by_dropped(
    conflicts: list[FileConflict], added_by: dict[str, str], upstream_label: str
) -> None:
    """Say so when a file upstream "deleted" was only ever added by a dropped patch.

    ``added_by`` maps a path to the patch that added it and was dropped
    (absorbed) earlier in the replay: upstream never had the file, so the
    question is whether this patch keeps it, not where upstream moved it.
    """
    for conflict in conflicts:
        dropped = added_by.get(conflict.path)
        if conflict.kind == DELETED_UPSTREAM and dropped:
            conflict.kind = (
                f"changed by the patch; added by the dropped patch {dropped!r}, "
                f"not in {upstream_label}: `git add` it to keep it in this patch, "
                "or `git rm` it"
            )


def _excerpt(lines: list[str]) -> list[str]:
    shown = [
        (line if len(line) <= EXCERPT_WIDTH else line[: EXCERPT_WIDTH - 3] + "...")
        for line in lines[:EXCERPT_LINES]
    ]
    if len(lines) > EXCERPT_LINES:
        shown.append(f"... ({len(lines) - EXCERPT_LINES} more line(s))")
    return shown or ["(nothing)"]


def format_conflicts(conflicts: list[FileConflict], upstream_label: str) -> list[str]:
    """Report lines: one block per file, one sub-block per conflicting hunk."""
    lines: list[str] = []
    for conflict in conflicts:
        count = f", {len(conflict.hunks)} hunk(s)" if conflict.hunks else ""
        lines.append(f"  {conflict.path}: {conflict.kind}{count}")
        for hunk in conflict.hunks:
            lines.append(f"    lines {hunk.start}-{hunk.end}:")
            lines.append(f"      {upstream_label}:")
            lines.extend(f"        | {line}" for line in _excerpt(hunk.ours))
            lines.append("      patch:")
            lines.extend(f"        | {line}" for line in _excerpt(hunk.theirs))
    return lines
