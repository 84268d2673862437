"""The one parser of unified diffs (patch files, ``git diff`` output): ``unidiff``.

Callers ask for what they need: the paths a patch touches
(:func:`touched_paths`) or the hunks it has per file (:func:`file_hunks`).
Mail headers and commit messages before the first ``diff --git`` line are
skipped by the parser.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from unidiff import PatchSet, UnidiffParseError

from vllm_fork.errors import SeriesError

log = logging.getLogger(__name__)

DEV_NULL = "/dev/null"


def _strip_prefix(path: str) -> str | None:
    """``a/x`` or ``b/x`` -> ``x``; None for ``/dev/null``."""
    if path == DEV_NULL:
        return None
    return path[2:] if path.startswith(("a/", "b/")) else path


def parse_diff(text: str, name: str = "patch") -> PatchSet:
    """Parse a unified diff; a malformed one raises SeriesError naming ``name``."""
    try:
        return PatchSet(text)
    except UnidiffParseError as exc:
        raise SeriesError(f"{name}: not a readable unified diff: {exc}") from None


def touched_paths(text: str, name: str = "patch") -> list[str]:
    """Every path a diff changes, creates, deletes or renames (both names of a
    rename), in the order the diff names them."""
    paths: list[str] = []
    for patched in parse_diff(text, name):
        for path in (_strip_prefix(patched.source_file), _strip_prefix(patched.target_file)):
            if path is not None and path not in paths:
                paths.append(path)
    return paths


def is_test_module(path: str) -> bool:
    """Whether a path a patch touches is a fork test module of the vLLM tree
    (``tests/.../test_*.py``): what `vllm-fork test` runs and prove-fail judges."""
    name = path.rsplit("/", 1)[-1]
    return path.startswith("tests/") and name.startswith("test_") and name.endswith(".py")


@dataclass(frozen=True)
class HunkInfo:
    old_start: int
    old_length: int
    header: str  # the ``@@ ... @@`` line as the diff writes it


def file_hunks(text: str, name: str = "patch") -> dict[str, list[HunkInfo]]:
    """Per file (its old path; the new one for a created file): its hunks in order."""
    lines = text.split("\n")  # as the parser counts lines: "\n" only
    hunks: dict[str, list[HunkInfo]] = {}
    for patched in parse_diff(text, name):
        path = _strip_prefix(patched.source_file) or _strip_prefix(patched.target_file)
        if path is None:
            continue
        for hunk in patched:
            # The header is the diff line just before the hunk's first line.
            first = next(iter(hunk), None)
            line_no = first.diff_line_no if first is not None else None
            number = line_no - 1 if line_no is not None else 0
            header = lines[number - 1] if 0 < number <= len(lines) else str(hunk).split("\n")[0]
            hunks.setdefault(path, []).append(
                HunkInfo(hunk.source_start, hunk.source_length, header)
            )
    return hunks
