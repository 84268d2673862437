"""`vllm-fork materialize`: a git work tree of a base plus its series.

The tree is a local clone of the cached upstream repository (objects are
hardlinked), on branch ``fork`` at ``upstream/<V>``, with one commit per
patch applied by ``git am``. The base version is recorded in the clone's
config (``vllm-fork.base``) for ``export``.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from vllm_fork import faults
from vllm_fork.atomic import place_dir
from vllm_fork.cache import TREE_PID_KEY
from vllm_fork.diffs import file_hunks
from vllm_fork.errors import (
    ForkError,
    GitError,
    PatchFailedError,
    SeriesError,
    UsageError,
    WorkTreeError,
    fs_fault,
    is_fs_fault,
)
from vllm_fork.facts.names import FORK, commit_identity, tag_for
from vllm_fork.git import git_env, git_out, run_git
from vllm_fork.lock import clear_owned, dir_lock, owned_tempdir
from vllm_fork.sources.pins import require_supported
from vllm_fork.sources.upstream import ensure_upstream
from vllm_fork.sources.workspace import Workspace
from vllm_fork.tree.apply import MERGE_CONFIG, apply_problems, last_line

log = logging.getLogger(__name__)

BRANCH = "fork"
BASE_KEY = "vllm-fork.base"
# The fork repository the tree was made from: export and rebase write its series.
REPO_KEY = "vllm-fork.repo"


@dataclass(frozen=True)
class MaterializeResult:
    path: Path
    version: str
    applied: int


def _listing(dest: Path, limit: int = 5) -> str:
    names = sorted(child.name for child in dest.iterdir())
    shown = ", ".join(names[:limit]) + (
        f", ... ({len(names)} entries)" if len(names) > limit else ""
    )
    return shown


def _check_target(config: Workspace, dest: Path, *, internal: bool = False) -> None:
    """Refuse a target that is not a new or empty directory the tool may fill.

    ``internal``: a tree the tool makes for itself in its work area
    (``<cache>/work``, e.g. a build tree), the one place in the cache allowed.
    """
    cache = config.cache_dir.resolve()
    resolved = dest.resolve()
    work = config.cache.work.resolve()
    allowed = internal and work in resolved.parents
    if not allowed and (resolved == cache or cache in resolved.parents):
        raise WorkTreeError(
            f"{dest} is inside the vllm-fork cache ({cache}); choose a directory outside it"
        )
    for parent in dest.parents:
        if parent.exists() and not parent.is_dir():
            raise WorkTreeError(f"cannot create {dest}: {parent} is not a directory")
        if parent.is_dir():
            break
    if dest.is_symlink() or (dest.exists() and not dest.is_dir()):
        raise WorkTreeError(f"{dest} exists and is not a directory; refusing to use it")
    if dest.is_dir() and any(dest.iterdir()):
        made = run_git(["config", "--get", BASE_KEY], cwd=dest, check=False)
        what = (
            f"a work tree of vLLM {made.stdout.decode().strip()}"
            if (dest / ".git").exists() and made.returncode == 0
            else _listing(dest)
        )
        raise WorkTreeError(
            f"{dest} is not empty; refusing to materialize into it (it holds {what}; "
            "choose a new directory)"
        )


def am_env() -> dict[str, str]:
    """Fixed committer identity so that the same series gives the same commit ids."""
    return git_env(commit_identity(), isolated=True)


def explain_failure(tree: Path, patch: Path) -> list[str]:
    """Which files and hunks of ``patch`` do not apply to the tree's current state."""
    proc = run_git(["apply", "--check", "-v", patch], cwd=tree, check=False)
    text = proc.stderr.decode(errors="replace")
    try:
        hunks = file_hunks(patch.read_text(errors="replace"), patch.name)
    except SeriesError:  # a malformed patch: git's own lines below still say where
        hunks = {}
    problems: list[str] = []
    for problem in apply_problems(text):
        if problem.kind == "hunk":
            headers = [h.header for h in hunks.get(problem.path, []) if h.old_start == problem.line]
            where = headers[0] if headers else f"line {problem.line}"
            problems.append(f"{problem.path}: hunk {where} does not apply")
        elif problem.kind == "missing":
            problems.append(f"{problem.path}: file to patch does not exist in the base")
        elif problem.kind == "exists":
            problems.append(f"{problem.path}: file to create already exists")
    if not problems:
        problems.append(last_line(text, "git am failed (no detail from git apply)"))
    return problems


def apply_series(tree: Path, patches: tuple[Path, ...]) -> int:
    """Apply ``patches`` one ``git am`` each; on failure abort and raise PatchFailedError.
    A patch that needs ``--3way`` is merged by the rules of tree/apply.py."""
    env = am_env()
    am = [*MERGE_CONFIG, "am", "--keep", "--3way", "--committer-date-is-author-date", "--quiet"]
    for count, patch in enumerate(patches):
        proc = run_git(
            [*am, patch],
            cwd=tree,
            env=env,
            check=False,
        )
        if proc.returncode != 0:
            run_git(["am", "--abort"], cwd=tree, env=env, check=False)
            problems = explain_failure(tree, patch)
            raise PatchFailedError(
                f"patch {patch.name} (#{count + 1} of {len(patches)}) does not apply:\n  "
                + "\n  ".join(problems),
            )
        faults.point("materialize.am")
    return len(patches)


def tree_repository(tree: Path) -> Path | None:
    """The fork repository ``tree`` was made from (None: not recorded)."""
    proc = run_git(["config", "--get", REPO_KEY], cwd=tree, check=False)
    value = proc.stdout.decode().strip() if proc.returncode == 0 else ""
    return Path(value) if value else None


def materialize(
    config: Workspace,
    version: str | None,
    dest: Path,
    *,
    keep_failed: bool = False,
    internal: bool = False,
    exclude: Collection[str] = (),
    allow_unsupported: bool = True,
) -> MaterializeResult:
    """Create ``dest`` as the work tree of base ``version`` plus its series.

    The tree is built in a marked sibling directory and renamed into place
    when complete: a run killed at any point leaves no ``dest`` (its marked
    leftovers are removed by the next run), never a partial one. Runs on the
    same ``dest`` are serialized by a lock; the later one then refuses the
    finished tree. ``internal``: ``dest`` is in the tool's own work area
    (``<cache>/work``), for build and audit trees. ``exclude``: file names of
    patches to leave out (internal trees only: a precompiled build leaves out
    the ``Fork-Build: full`` patches; a user's tree always has the whole series).
    ``allow_unsupported`` False: a base bases.toml does not mark supported is refused.
    """
    base = config.base(version)
    require_supported(config, base, allow=allow_unsupported)
    dest = dest.absolute()
    if exclude and not internal:
        raise UsageError("only the tool's own build trees may leave patches out of the series")
    _check_target(config, dest, internal=internal)
    series = config.series(base.version)
    unknown = sorted(set(exclude) - {p.name for p in series.patches})
    if unknown:
        raise SeriesError(f"series/{base.version} has no patch {', '.join(unknown)} to leave out")
    series = series.without(exclude)
    tag = ensure_upstream(config, base)
    with dir_lock(config.cache_dir, dest):
        _check_target(config, dest, internal=internal)
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            clear_owned(dest.parent, f"{dest.name}.")
            work = owned_tempdir(dest.parent, dest.name)
        except OSError as exc:
            if is_fs_fault(exc):
                raise fs_fault(exc, dest.parent, f"creating {dest}") from exc
            raise WorkTreeError(f"cannot create {dest}: {exc.strerror or exc}") from exc
        try:
            return _build(
                config,
                base.version,
                tag,
                series.patches,
                work / "tree",
                dest,
                keep_failed,
                internal=internal,
            )
        finally:
            shutil.rmtree(work, ignore_errors=True)


def _place(tree: Path, dest: Path) -> None:
    try:
        place_dir(tree, dest, fault="materialize.rename")
    except OSError as exc:
        if is_fs_fault(exc):
            raise fs_fault(exc, dest, "moving the finished tree into place") from exc
        raise WorkTreeError(
            f"cannot move the finished tree into {dest}: {exc.strerror or exc}"
        ) from exc


def _build(
    config: Workspace,
    version: str,
    tag: str,
    patches: tuple[Path, ...],
    tree: Path,
    dest: Path,
    keep_failed: bool,
    *,
    internal: bool = False,
) -> MaterializeResult:
    try:
        repo = config.upstream_repo
        run_git(["clone", "-q", "--local", "--no-checkout", repo, tree], env=git_env(isolated=True))
        faults.point("materialize.clone")
        others = [
            ref
            for ref in git_out(
                ["for-each-ref", "--format=%(refname)", "refs/tags"], cwd=tree
            ).splitlines()
            if ref != f"refs/tags/{tag}"
        ]
        if others:
            run_git(
                ["update-ref", "--stdin"],
                cwd=tree,
                input="".join(f"delete {ref}\n" for ref in others).encode(),
            )
        run_git(["remote", "remove", "origin"], cwd=tree)
        run_git(["config", BASE_KEY, version], cwd=tree)
        run_git(["config", REPO_KEY, str(config.root)], cwd=tree)
        # The fork's identity, local to the tree: a plain `git commit` (or the
        # `cherry-pick --continue` a backport conflict asks for) works on a machine
        # with none, and makes the author export requires of every patch.
        run_git(["config", "user.name", FORK[0]], cwd=tree)
        run_git(["config", "user.email", FORK[1]], cwd=tree)
        if internal:  # a tree of the work area: whose it is (`vllm-fork cache prune`)
            run_git(["config", TREE_PID_KEY, str(os.getpid())], cwd=tree)
        run_git(["checkout", "-q", "-b", BRANCH, tag_for(version)], cwd=tree)
        faults.point("materialize.checkout")
        try:
            applied = apply_series(tree, patches)
        except PatchFailedError as exc:
            if keep_failed:
                head = git_out(["log", "-1", "--format=%s", "HEAD"], cwd=tree)
                _place(tree, dest)
                raise PatchFailedError(
                    f"{exc}\n{dest} was kept for inspection at the last commit that applied: {head}"
                ) from None
            raise PatchFailedError(
                f"{exc}\n{dest} was not created (use --keep-failed to keep the partial tree)"
            ) from None
        _place(tree, dest)
        return MaterializeResult(dest, version, applied)
    except GitError as exc:
        raise ForkError(f"materialize of {version} into {dest} failed: {exc}") from exc
