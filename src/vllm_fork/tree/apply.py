"""Apply a patch or a series to a commit without a work tree: the one applier.

Every command that asks "does this patch apply here" goes through this
module, so that the answer means the same everywhere:

- **exact**: ``git apply --cached`` of the patch into a temporary index read
  from the target tree (status, and the first try of every 3-way apply);
- **3-way**: the patch as a commit on its own base (the tree it was made
  against, ``parent``, and that tree with the patch, ``patched``), merged onto
  the target the way ``git cherry-pick`` would: ``git merge-tree
  --write-tree`` of two synthetic commits that share a parent whose tree is
  ``parent`` (merge-ort, rename detection on, directory rename detection
  off: a file the patch adds stays where the patch puts it). This is the
  merge a rebase (rebase/replay.py) and ``git am -3`` make.

git 2.39 is enough (``merge-tree --write-tree`` without ``--merge-base``).
Objects go to a private object directory over the repository when asked
(``private=True``), so a read-only question leaves the repository unchanged.

The one parser of ``git apply`` errors, :func:`apply_problems`, is here too.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from vllm_fork.git import FORK_EMAIL, FORK_NAME, git_env, git_out, run_git

CLEAN = "clean"
MERGED = "3-way merge"
EMPTY = "empty"
CONFLICT = "conflict"

# The merge rules of every 3-way apply (the same as rebase/replay.py's cherry-pick).
MERGE_CONFIG = ("-c", "merge.renames=true", "-c", "merge.directoryRenames=false")
# Synthetic commits only carry trees; a fixed identity and date keep them
# independent of the user's git configuration.
_IDENTITY = {
    "GIT_AUTHOR_NAME": FORK_NAME,
    "GIT_AUTHOR_EMAIL": FORK_EMAIL,
    "GIT_AUTHOR_DATE": "1700000000 +0000",
    "GIT_COMMITTER_NAME": FORK_NAME,
    "GIT_COMMITTER_EMAIL": FORK_EMAIL,
    "GIT_COMMITTER_DATE": "1700000000 +0000",
}


@dataclass(frozen=True)
class Problem:
    """One file of a patch that ``git apply`` refused, and why."""

    path: str
    kind: str  # "hunk" (with line), "missing", "exists", "conflict", "fails"
    line: int = 0


_PATTERNS = (
    (re.compile(r"^error: patch failed: (.+):(\d+)$"), "hunk"),
    (re.compile(r"^Applied patch to '(.+)' with conflicts\.$"), "conflict"),
    (
        re.compile(r"^error: (.+): (?:does not exist in index|No such file or directory)$"),
        "missing",
    ),
    (re.compile(r"^error: (.+): patch does not apply$"), "fails"),
    (re.compile(r"^error: (.+): already exists in (?:index|working directory)$"), "exists"),
)


def apply_problems(stderr: str) -> list[Problem]:
    """The files ``git apply`` (or ``git am``) refused, in the order of its messages."""
    problems: list[Problem] = []
    for text in stderr.splitlines():
        for pattern, kind in _PATTERNS:
            m = pattern.match(text)
            if m:
                line = int(m.group(2)) if kind == "hunk" else 0
                problems.append(Problem(m.group(1), kind, line))
                break
    return problems


def last_line(stderr: str, default: str) -> str:
    lines = [ln for ln in stderr.strip().splitlines() if ln]
    return lines[-1] if lines else default


@dataclass(frozen=True)
class Applied:
    """What applying one patch gave: the new tree (the target's when it failed)."""

    status: str  # CLEAN, MERGED, EMPTY or CONFLICT
    tree: str
    conflicts: tuple[str, ...] = ()  # paths, on CONFLICT
    messages: tuple[str, ...] = ()  # the merge's messages (``CONFLICT (content): ...``)
    moved: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())  # (paths gone, paths came)

    @property
    def ok(self) -> bool:
        return self.status != CONFLICT

    def detail(self) -> str:
        """The one-line account status and matrix print."""
        if self.status == CONFLICT:
            return "conflicts in " + ", ".join(self.conflicts)
        if self.status == EMPTY:
            return "upstream already has the same edit"
        detail = self.status
        gone, came = self.moved
        if gone and came:
            detail += f", followed moved file(s): {', '.join(gone)} -> {', '.join(came)}"
        return detail


class ApplyError(Exception):
    """An exact apply failed; ``stderr`` is git's account."""

    def __init__(self, stderr: str) -> None:
        super().__init__(stderr)
        self.stderr = stderr


class SeriesApplyError(ApplyError):
    """A patch of a series does not apply exactly."""

    def __init__(self, patch: Path, stderr: str) -> None:
        super().__init__(stderr)
        self.patch = patch


class Applier:
    """A temporary index (and, ``private``, object directory) over a repository."""

    def __init__(self, repo: Path, directory: Path, *, private: bool = False) -> None:
        self.repo = repo
        self.directory = directory
        self.index = directory / "index"
        extra = {"GIT_DIR": str(repo), "GIT_INDEX_FILE": str(self.index)}
        if private:
            (directory / "objects").mkdir(parents=True, exist_ok=True)
            extra["GIT_OBJECT_DIRECTORY"] = str(directory / "objects")
            extra["GIT_ALTERNATE_OBJECT_DIRECTORIES"] = str(repo / "objects")
        self.env = git_env(extra, isolated=True)

    def git(self, *args: str | os.PathLike[str], check: bool = True, input: bytes | None = None):
        return run_git(list(args), env=self.env, cwd=self.directory, check=check, input=input)

    def out(self, *args: str | os.PathLike[str]) -> str:
        return git_out(list(args), env=self.env, cwd=self.directory)

    # --- exact ---------------------------------------------------------------------

    def exact(self, tree: str | None, patch: Path | bytes) -> str:
        """``tree`` (None: the index as it is) with ``patch`` applied exactly; ApplyError
        when it does not apply (the index is then left as it was)."""
        if tree is not None:
            self.git("read-tree", tree)
        if isinstance(patch, bytes):
            proc = self.git("apply", "--cached", "-", input=patch, check=False)
        else:
            proc = self.git("apply", "--cached", patch, check=False)
        if proc.returncode != 0:
            raise ApplyError(proc.stderr.decode(errors="replace").strip())
        return self.out("write-tree")

    def series(self, tree: str, patches: list[Path]) -> list[str]:
        """The trees after each patch, applied exactly in order onto ``tree``;
        SeriesApplyError names the patch that does not apply."""
        self.git("read-tree", tree)
        trees = []
        for patch in patches:
            try:
                trees.append(self.exact(None, patch))
            except ApplyError as exc:
                raise SeriesApplyError(patch, exc.stderr) from None
        return trees

    # --- 3-way ---------------------------------------------------------------------

    def _commit(self, tree: str, *parents: str) -> str:
        args = ["commit-tree", tree]
        for parent in parents:
            args += ["-p", parent]
        env = {**self.env, **_IDENTITY}
        return run_git(args, env=env, cwd=self.directory, input=b"apply\n").stdout.decode().strip()

    def merge(self, parent: str, patched: str, onto: str) -> Applied:
        """Cherry-pick the change ``parent`` -> ``patched`` (trees) onto tree ``onto``."""
        base = self._commit(parent)
        ours = self._commit(onto, base)
        theirs = self._commit(patched, base)
        proc = self.git(
            *MERGE_CONFIG, "merge-tree", "--write-tree", "--name-only", ours, theirs, check=False
        )
        if proc.returncode not in (0, 1):
            raise ApplyError(proc.stderr.decode(errors="replace").strip())
        lines = proc.stdout.decode(errors="surrogateescape").split("\n")
        tree, rest = lines[0], lines[1:]
        conflicts: list[str] = []
        if proc.returncode == 1:
            while rest and rest[0]:
                if rest[0] not in conflicts:
                    conflicts.append(rest[0])
                rest = rest[1:]
        messages = tuple(ln for ln in rest if ln)
        if proc.returncode == 1:
            return Applied(CONFLICT, onto, tuple(conflicts), messages)
        return Applied(MERGED, tree, (), messages, self._moved(parent, patched, onto, tree))

    def _changed(self, old: str, new: str) -> set[str]:
        out = self.out("diff-tree", "-r", "--no-renames", "--name-only", "-z", old, new)
        return {p for p in out.split("\0") if p}

    def _moved(
        self, parent: str, patched: str, onto: str, tree: str
    ) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """Files the patch changed that the result changed elsewhere: a followed move."""
        old, new = self._changed(parent, patched), self._changed(onto, tree)
        return tuple(sorted(old - new)), tuple(sorted(new - old))

    def apply(self, onto: str, patch: Path | bytes, parent: str, patched: str) -> Applied:
        """Apply one patch onto tree ``onto``: exactly when it applies so, else by a
        3-way merge of its commit (``parent`` -> ``patched``). EMPTY: nothing changed."""
        try:
            tree = self.exact(onto, patch)
            result = Applied(CLEAN, tree)
        except ApplyError:
            result = self.merge(parent, patched, onto)
        if result.ok and result.tree == onto:
            return Applied(EMPTY, onto)
        return result


@contextmanager
def applier(
    repo: Path, *, private: bool = False, prefix: str = "vllm-fork-apply-"
) -> Iterator[Applier]:
    """An :class:`Applier` over ``repo`` in a temporary directory, removed afterwards."""
    # Not in <cache>/tmp: taking the cache lock empties that directory.
    directory = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield Applier(repo, directory, private=private)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def tree_of(repo: Path, rev: str) -> str:
    return git_out(["rev-parse", f"{rev}^{{tree}}"], env=git_env({"GIT_DIR": str(repo)}))


def repo_of(tree: Path) -> Path:
    """The git directory of work tree ``tree``."""
    return Path(git_out(["rev-parse", "--absolute-git-dir"], cwd=tree))
