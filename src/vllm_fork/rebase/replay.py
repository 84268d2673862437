"""Replay one commit of a series onto the detached HEAD of a work tree.

The pick is ``git cherry-pick --no-commit`` (merge-ort: a 3-way merge with
rename detection, so a patch follows a file upstream moved). Directory
rename detection is off: a file the patch adds stays where the patch puts
it, even when upstream moved every other file out of that directory (0.33.0
emptied tests/rocm/aiter/, where the fork keeps its simulation tests). The commit is
then written with ``git commit-tree``: the original message and author,
the fork's committer identity and committer date = author date, so that
replaying the same series onto the same base gives the same commit ids.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from vllm_fork.errors import GitError
from vllm_fork.facts.names import commit_identity
from vllm_fork.git import git_env, git_out, run_git
from vllm_fork.rebase.conflicts import unmerged_stages

APPLIED = "applied"
EMPTY = "empty"
CONFLICT = "conflict"

# Files a cherry-pick leaves in the git directory.
PICK_LEFTOVERS = ("MERGE_MSG", "AUTO_MERGE", "CHERRY_PICK_HEAD", "SQUASH_MSG")


def work_env() -> dict[str, str]:
    """Environment for git commands that change the work tree: user config ignored."""
    return git_env(commit_identity(), isolated=True)


@dataclass(frozen=True)
class PickOutcome:
    status: str  # APPLIED, EMPTY or CONFLICT
    detail: str
    commit: str = ""


def git_dir(tree: Path) -> Path:
    return Path(git_out(["rev-parse", "--absolute-git-dir"], cwd=tree))


def clear_leftovers(tree: Path) -> None:
    gd = git_dir(tree)
    for name in PICK_LEFTOVERS:
        (gd / name).unlink(missing_ok=True)


def _changed_paths(tree: Path, old: str, new: str) -> set[str]:
    out = git_out(
        ["diff", "--no-renames", "--name-only", "-z", old, new],
        cwd=tree,
        env=git_env(isolated=True),
    )
    return {p for p in out.split("\0") if p}


def _applies_cleanly(tree: Path, commit: str) -> bool:
    """Whether the commit's diff applies to the index exactly (no merge needed)."""
    env = git_env(isolated=True)
    diff = run_git(
        ["diff", "--no-renames", "--full-index", "--binary", f"{commit}^", commit],
        cwd=tree,
        env=env,
    ).stdout
    if not diff:
        return True
    proc = run_git(
        ["apply", "--cached", "--check", "-"], cwd=tree, env=env, input=diff, check=False
    )
    return proc.returncode == 0


def recommit(tree: Path, source: str, parent: str, tree_id: str | None = None) -> str:
    """A commit with ``source``'s message and author on ``parent``; committer date =
    author date. ``tree_id`` defaults to the current index."""
    fields = git_out(
        ["log", "-1", "--date=raw", "--format=%an%x00%ae%x00%ad", source], cwd=tree
    ).split("\0")
    name, email, date = fields
    env = git_env(
        commit_identity(author=(name, email), author_date=date, committer_date=date),
        isolated=True,
    )
    if tree_id is None:
        tree_id = git_out(["write-tree"], cwd=tree, env=env)
    raw = run_git(["cat-file", "commit", source], cwd=tree).stdout
    _, _, message = raw.partition(b"\n\n")
    return (
        run_git(["commit-tree", tree_id, "-p", parent], cwd=tree, env=env, input=message)
        .stdout.decode()
        .strip()
    )


def commit_index(tree: Path, source: str) -> str:
    """Commit the index onto HEAD as a replay of ``source``; move HEAD; return the id."""
    head = git_out(["rev-parse", "HEAD"], cwd=tree)
    new = recommit(tree, source, head)
    run_git(
        ["update-ref", "-m", f"vllm-fork rebase: pick {source[:12]}", "HEAD", new, head], cwd=tree
    )
    clear_leftovers(tree)
    return new


def normalize(tree: Path, base: str) -> str:
    """Rewrite the commits base..HEAD (made by hand) with committer = fork identity and
    committer date = author date; their trees and messages are kept. Returns HEAD."""
    head = git_out(["rev-parse", "HEAD"], cwd=tree)
    commits = git_out(["rev-list", "--reverse", f"{base}..{head}"], cwd=tree).split()
    parent = base
    for commit in commits:
        parent = recommit(
            tree, commit, parent, git_out(["rev-parse", f"{commit}^{{tree}}"], cwd=tree)
        )
    if parent != head:
        run_git(["update-ref", "-m", "vllm-fork rebase: normalize", "HEAD", parent, head], cwd=tree)
    return parent


def pick(tree: Path, commit: str) -> PickOutcome:
    """Replay ``commit`` onto HEAD (index and work tree must be clean)."""
    clean = _applies_cleanly(tree, commit)
    proc = run_git(
        [
            "-c",
            "merge.conflictStyle=diff3",
            "-c",
            "merge.renames=true",
            "-c",
            "merge.directoryRenames=false",
            "cherry-pick",
            "--no-commit",
            commit,
        ],
        cwd=tree,
        env=work_env(),
        check=False,
    )
    if proc.returncode != 0:
        if unmerged_stages(tree):
            return PickOutcome(CONFLICT, "3-way merge left conflicts")
        detail = proc.stderr.decode(errors="replace").strip()
        raise GitError(f"git cherry-pick of {commit[:12]} failed: {detail}")
    head = git_out(["rev-parse", "HEAD"], cwd=tree)
    index_tree = git_out(["write-tree"], cwd=tree, env=work_env())
    if index_tree == git_out(["rev-parse", f"{head}^{{tree}}"], cwd=tree):
        clear_leftovers(tree)
        return PickOutcome(EMPTY, "the 3-way merge left nothing to change")
    new = commit_index(tree, commit)
    detail = "clean" if clean else "3-way merge"
    old_paths = _changed_paths(tree, f"{commit}^", commit)
    new_paths = _changed_paths(tree, head, new)
    gone, came = sorted(old_paths - new_paths), sorted(new_paths - old_paths)
    if gone and came:
        detail += f", followed moved file(s): {', '.join(gone)} -> {', '.join(came)}"
    return PickOutcome(APPLIED, detail, new)
