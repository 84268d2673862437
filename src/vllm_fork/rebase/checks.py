"""What ``vllm-fork rebase`` refuses: a start it cannot make safely, and a
resolution of a conflict that is not one (each with its message)."""

from __future__ import annotations

import re
from pathlib import Path

from vllm_fork.errors import RebaseRefusedError, UnknownVersionError, UsageError, WorkTreeError
from vllm_fork.git import git_env, git_out, run_git
from vllm_fork.rebase.conflicts import unmerged_stages
from vllm_fork.rebase.report import _arg
from vllm_fork.rebase.state import RebaseState, load_state
from vllm_fork.series import store
from vllm_fork.sources.pins import check_version
from vllm_fork.sources.workspace import Workspace
from vllm_fork.tree.materialize import BASE_KEY

IN_PROGRESS = (
    "CHERRY_PICK_HEAD",
    "MERGE_HEAD",
    "REVERT_HEAD",
    "rebase-apply",
    "rebase-merge",
    "BISECT_LOG",
)
_MARKER = re.compile(rb"^(<<<<<<<|>>>>>>>)( |$)", re.MULTILINE)


def status_lines(tree: Path) -> list[str]:
    out = git_out(["status", "--porcelain"], cwd=tree, env=git_env(isolated=True))
    return out.splitlines()


def _shown(lines: list[str], limit: int = 10) -> str:
    more = f"\n  ... and {len(lines) - limit} more" if len(lines) > limit else ""
    return "\n  ".join(lines[:limit]) + more


def check_start(
    config: Workspace, from_version: str, onto_version: str, new_series: Path, force: bool
) -> None:
    """Both releases pinned and different; no series/<V2>/ unless ``force``."""
    check_version(from_version)
    check_version(onto_version)
    if from_version == onto_version:
        raise UsageError(f"--from and --onto are both {from_version}")
    try:
        config.base(onto_version)
    except UnknownVersionError as exc:
        raise UnknownVersionError(f"{exc}; run `vllm-fork pin {onto_version}` first") from None
    if not force and store.has_series(new_series.parent, onto_version):
        raise RebaseRefusedError(
            f"{new_series} already exists; a rebase would overwrite it (pass --force-series "
            "to replace it)"
        )


def check_tree(tree: Path, git_dir: Path, from_version: str) -> str:
    """A clean work tree of ``from_version`` on a branch, no rebase or other git
    operation in progress; returns the branch."""
    existing = load_state(git_dir)
    if existing is not None:
        raise RebaseRefusedError(
            f"a rebase from {existing.from_version} onto {existing.onto_version} is in "
            f"progress in {tree}; run `vllm-fork rebase --continue {_arg(tree)}` or "
            f"`vllm-fork rebase --abort {_arg(tree)}`"
        )
    proc = run_git(["config", "--get", BASE_KEY], cwd=tree, check=False)
    base = proc.stdout.decode().strip() or None if proc.returncode == 0 else None
    if base != from_version:
        if base is None:
            raise RebaseRefusedError(
                f"{tree} is not a work tree made by `vllm-fork materialize` (it records no "
                "base); give the work tree as DIR (`vllm-fork rebase --from V1 --onto V2 "
                "DIR`), or a new directory to materialize V1 into"
            )
        raise RebaseRefusedError(f"{tree} is a work tree of {base}, not {from_version}")
    busy = [name for name in IN_PROGRESS if (git_dir / name).exists()]
    if busy:
        raise RebaseRefusedError(
            f"{tree} is in the middle of a git operation ({', '.join(busy)}); finish it first"
        )
    dirty = status_lines(tree)
    if dirty:
        raise RebaseRefusedError(
            f"{tree} has uncommitted changes or untracked files; commit, stash or remove "
            f"them before rebasing (nothing was changed):\n  {_shown(dirty)}"
        )
    proc = run_git(["symbolic-ref", "-q", "HEAD"], cwd=tree, check=False)
    branch = proc.stdout.decode().strip() if proc.returncode == 0 else ""
    if not branch.startswith("refs/heads/"):
        raise RebaseRefusedError(f"HEAD of {tree} is detached; check out the series branch")
    return branch


def check_resolution(tree: Path, state: RebaseState) -> str:
    """Check the user's resolution of the conflicted pick (committed or staged);
    returns how it was resolved."""
    unmerged = sorted(unmerged_stages(tree))
    if unmerged:
        raise WorkTreeError(
            "these files still have conflicts; edit them, then `git add` them (or commit):\n  "
            + _shown(unmerged)
        )
    head = git_out(["rev-parse", "HEAD"], cwd=tree)
    if head != state.expect_head:
        if run_git(
            ["merge-base", "--is-ancestor", state.expect_head, head], cwd=tree, check=False
        ).returncode:
            raise WorkTreeError(
                f"HEAD {head[:12]} does not descend from the rebase's {state.expect_head[:12]}; "
                f"reset to it, or `vllm-fork rebase --abort {_arg(tree)}`"
            )
        dirty = status_lines(tree)
        if dirty:
            raise WorkTreeError(
                "you committed part of the resolution; commit or discard the rest:\n  "
                + _shown(dirty)
            )
        count = len(git_out(["rev-list", f"{state.expect_head}..{head}"], cwd=tree).split())
        return f"conflict resolved by hand ({count} commit(s))"
    unstaged = [line for line in status_lines(tree) if line[1] != " " or line.startswith("??")]
    if unstaged:
        raise WorkTreeError(
            "stage the resolution (`git add`) or discard the rest; not staged:\n  "
            + _shown(unstaged)
        )
    for conflict in state.conflict:
        blob = run_git(["show", f":{conflict['path']}"], cwd=tree, check=False)
        if blob.returncode == 0 and _MARKER.search(blob.stdout):
            raise WorkTreeError(
                f"{conflict['path']} still contains conflict markers; fix it and `git add` it"
            )
    if not run_git(["diff", "--cached", "--quiet"], cwd=tree, check=False).returncode:
        raise WorkTreeError(
            "nothing is staged: the resolution would drop the patch. Stage the resolved "
            f"files (`git add`), or run `vllm-fork rebase --skip --reason TEXT {_arg(tree)}` "
            "if upstream already has it"
        )
    return "3-way merge, conflict resolved by hand"
