"""The one reader of a work tree's series commits.

A materialized work tree is ``upstream/<V>`` plus one commit per patch.
Everything that needs those commits (export, status ``--tree``, rebase,
``test``) reads them here, with one ``git log`` over ``upstream/<V>..HEAD``:
hash, parents, subject, message, the trailers as git itself parses them
(``%(trailers)``) and the files each commit changes (``--name-status -z``,
no rename detection: a move is a delete plus an add).

Edge cases, decided once:

- a merge commit in the range is refused (a series is linear);
- HEAD must descend from the base tag, and the tag must exist;
- an empty commit is a commit with no files;
- a commit without trailers has none (``change`` and ``part`` are ``""``);
- a detached HEAD is read like a branch: commands that must move a branch
  (rebase, export) check that themselves.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from vllm_fork.errors import GitError, WorkTreeError
from vllm_fork.facts.names import tag_for
from vllm_fork.git import git_env, run_git
from vllm_fork.series.patches import TrailerFields
from vllm_fork.tree.materialize import BASE_KEY

log = logging.getLogger(__name__)

# One record per commit: RS, then NUL-separated fields, then git's name-status list.
_RECORD = "\x1e"
_FORMAT = f"--format={_RECORD}%H%x00%P%x00%s%x00%B%x00%(trailers:only,unfold)%x00"


@dataclass(frozen=True)
class FileChange:
    """One file a commit changes: git's status letter (A, M, D, T) and the path."""

    status: str
    path: str


@dataclass(frozen=True)
class SeriesCommit(TrailerFields):
    sha: str
    parent: str
    subject: str  # git's %s: the first paragraph of the message, lines joined
    message: str
    trailers: tuple[tuple[str, str], ...]
    files: tuple[FileChange, ...]

    def paths(self, *statuses: str) -> list[str]:
        """Paths the commit changes, only those with one of ``statuses`` if given."""
        return [f.path for f in self.files if not statuses or f.status in statuses]


def tree_base(tree: Path) -> str:
    """The base version recorded in a work tree by materialize."""
    if not (tree / ".git").exists():
        raise WorkTreeError(f"{tree} is not a git work tree made by `vllm-fork materialize`")
    proc = run_git(["config", "--get", BASE_KEY], cwd=tree, check=False)
    version = proc.stdout.decode().strip()
    if proc.returncode != 0 or not version:
        raise WorkTreeError(
            f"{tree} records no base version (git config {BASE_KEY}); "
            "was it made by `vllm-fork materialize`?"
        )
    return version


def _trailers(text: str) -> tuple[tuple[str, str], ...]:
    found = []
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip():
            found.append((key.strip(), value.strip()))
    return tuple(found)


def _files(tokens: list[str]) -> tuple[FileChange, ...]:
    tokens = [t.strip("\n") for t in tokens]
    tokens = [t for t in tokens if t]
    files = []
    i = 0
    while i < len(tokens):
        status = tokens[i]
        if status[:1] in ("R", "C"):  # only with rename detection: old path, new path
            files.append(FileChange(status[:1], tokens[i + 2]))
            i += 3
        else:
            files.append(FileChange(status[:1], tokens[i + 1]))
            i += 2
    return tuple(files)


def parse_log(raw: str) -> list[SeriesCommit]:
    """Commits from the output of ``git log -z --name-status`` with this module's format."""
    commits = []
    for record in raw.split(_RECORD)[1:]:
        sha, parents, subject, message, trailers, *rest = record.split("\0")
        parent_list = parents.split()
        if len(parent_list) > 1:
            raise WorkTreeError(f"commit {sha[:12]} is a merge; a series must be linear")
        commits.append(
            SeriesCommit(
                sha=sha,
                parent=parent_list[0] if parent_list else "",
                subject=subject,
                message=message,
                trailers=_trailers(trailers),
                files=_files(rest),
            )
        )
    return commits


def _log(tree: Path, args: Sequence[str]) -> str:
    return run_git(
        ["log", "-z", "--no-renames", "--name-status", "--no-ext-diff", _FORMAT, *args],
        cwd=tree,
        env=git_env(isolated=True),
    ).stdout.decode("utf-8", errors="surrogateescape")


def series_commits(tree: Path, base: str | None = None) -> list[SeriesCommit]:
    """The commits of ``tree`` after ``base`` (default: the tag of its recorded base
    version), oldest first. Raises WorkTreeError for a missing base, a HEAD that
    does not descend from it, or a merge commit."""
    if base is None:
        base = tag_for(tree_base(tree))
    proc = run_git(["merge-base", "--is-ancestor", base, "HEAD"], cwd=tree, check=False)
    if proc.returncode != 0:
        known = run_git(
            ["rev-parse", "--verify", "-q", f"{base}^{{commit}}"], cwd=tree, check=False
        )
        if known.returncode != 0:
            raise WorkTreeError(f"{tree} has no tag {base}")
        raise WorkTreeError(f"HEAD of {tree} does not descend from {base}")
    try:
        commits = parse_log(_log(tree, ["--reverse", f"{base}..HEAD"]))
    except WorkTreeError as exc:
        raise WorkTreeError(
            f"{tree} has merge commits after {base}; a series must be linear"
        ) from exc
    log.debug("%s: %d series commit(s) after %s", tree, len(commits), base)
    return commits


def read_commits(tree: Path, revs: Sequence[str]) -> list[SeriesCommit]:
    """The given commits of ``tree``, in the order given (one ``git log --no-walk``)."""
    if not revs:
        return []
    try:
        return parse_log(_log(tree, ["--no-walk=unsorted", *revs]))
    except GitError as exc:
        raise WorkTreeError(f"cannot read commits of {tree}: {exc}") from exc
