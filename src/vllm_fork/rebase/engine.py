"""`vllm-fork rebase`: move a work tree's series from upstream V1 onto V2.

``git rebase`` does the replay; this module plans it and wraps it:

1. checks (rebase/checks.py): a clean work tree of V1 on a branch, V2
   pinned, no series/V2 yet;
   the pre-rebase HEAD is kept in ``refs/vllm-fork/pre-rebase/<V1>`` and
   every ref the rebase may move is recorded (``.git/vllm-fork-rebase.json``,
   rebase/state.py) before anything changes;
2. import: upstream V2's tree committed on top of ``upstream/V1`` (tagged
   ``upstream/V2`` in the work tree);
3. plan: the probes run once on V2; a ``Fork-Part: change`` patch whose
   change V2 has is a ``drop`` line (absorbed), every other patch a ``pick``
   followed by a ``break``;
4. ``git rebase -i --onto upstream/V2 upstream/V1 <branch>`` with that todo
   list, ``--empty=drop`` (a pick that leaves nothing to change is absorbed)
   and the rules of every 3-way apply (tree/apply.py: renames followed,
   directory renames off, diff3 conflict style). At each ``break`` the
   commit just made is recorded: its committer becomes the fork's identity
   with committer date = author date (author, message and trailers are
   git's copy of the original), so that replaying the same series onto the
   same base gives the same commit ids (rebase/report.py says how each pick
   went). A conflict stops git and the command, with a report;
5. finish: git moved the branch; the tree records base V2, series/<V2>/ is
   exported, and the review (rebase/review.py) says what became of each
   patch, the absorbed ones with their evidence. The series files hold the
   order only: nothing is written back into the older base's series.

``--continue`` / ``--skip`` are ``git rebase --continue`` / ``--skip`` after
the checks of a resolution and the records of this module; ``--abort`` is ``git rebase --quit``
and then every recorded ref, HEAD, the recorded base and series/<V2>/ put
back exactly as they were. After a crash, ``--continue`` goes on from what
git's own sequencer state and the state file say.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vllm_fork import faults
from vllm_fork.errors import (
    ForkError,
    GitError,
    RebaseRefusedError,
    WorkTreeError,
)
from vllm_fork.facts.names import commit_identity, tag_for
from vllm_fork.git import git_env, git_out, ref_exists, run_git
from vllm_fork.probes import GitTree, probe_all
from vllm_fork.rebase.checks import check_resolution, check_start, check_tree, status_lines
from vllm_fork.rebase.conflicts import unmerged_stages
from vllm_fork.rebase.report import conflict_report, describe_stop, old_series_names, pick_detail
from vllm_fork.rebase.review import review_rebase
from vllm_fork.rebase.state import (
    ABSORBED,
    APPLIED,
    CONFLICT,
    FINISHING,
    IMPORTING,
    PICKING,
    SKIPPED,
    Pick,
    RebaseState,
    clear_state,
    load_state,
    save_state,
)
from vllm_fork.series import store
from vllm_fork.sources.upstream import ensure_upstream
from vllm_fork.sources.workspace import Workspace, recorded_workspace
from vllm_fork.tree.apply import MERGE_CONFIG, repo_of
from vllm_fork.tree.commits import series_commits
from vllm_fork.tree.export import export
from vllm_fork.tree.materialize import BASE_KEY, materialize, tree_repository
from vllm_fork.tree.stacking import import_ref, stack_upstream

__all__ = ["RebaseConflict", "abort_rebase", "continue_rebase", "conflict_report", "start_rebase"]

BACKUP_PREFIX = "refs/vllm-fork/pre-rebase/"
TODO_FILE = "vllm-fork-rebase-todo"
_GIT_CONFIG = ("-c", "merge.conflictStyle=diff3", *MERGE_CONFIG)

Log = Callable[[str], None]


class RebaseConflict(ForkError):
    """The replay stopped on a conflict; the message is the report for the user."""


@dataclass
class RebaseResult:
    state: RebaseState
    written: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    review: list[str] = field(default_factory=list)  # files the review was written to


def backup_ref(version: str) -> str:
    return f"{BACKUP_PREFIX}{version}"


def _rev(tree: Path, rev: str) -> str | None:
    proc = run_git(["rev-parse", "--verify", "-q", f"{rev}^{{commit}}"], cwd=tree, check=False)
    return proc.stdout.decode().strip() if proc.returncode == 0 else None


def _head(tree: Path) -> str:
    return git_out(["rev-parse", "HEAD"], cwd=tree)


def work_env(**extra: str) -> dict[str, str]:
    """git commands that change the work tree: user config ignored, no editor."""
    return git_env(
        commit_identity() | {"GIT_EDITOR": ":"} | extra,
        isolated=True,
    )


def _open_tree(tree: Path) -> Path:
    """The git dir of an existing work tree (error if ``tree`` is not one)."""
    if not tree.is_dir():
        raise WorkTreeError(f"{tree} is not a directory")
    proc = run_git(["rev-parse", "--show-toplevel"], cwd=tree, check=False)
    if proc.returncode != 0 or Path(proc.stdout.decode().strip()).resolve() != tree.resolve():
        raise WorkTreeError(f"{tree} is not the top of a git work tree")
    return repo_of(tree)


def probe_upstream(tree: Path, commit: str) -> dict[str, tuple[Any, ...]]:
    """change id -> (state, reason, hardening) of the probes on a commit of the work tree."""
    return {
        cid: (f.state, f.reason, dict(f.hardening))
        for cid, f in probe_all(GitTree(tree, commit)).items()
    }


# --- start -------------------------------------------------------------------------


def start_rebase(
    config: Workspace,
    from_version: str,
    onto_version: str,
    tree: Path,
    *,
    force_series: bool = False,
    review: Path | None = None,
    log: Log = print,
) -> RebaseResult:
    """Start a rebase; returns when done, raises RebaseConflict on a conflict.
    ``review``: also write the review there (Markdown; JSON beside it). The
    series are written to the repository an existing tree was made from."""
    tree = tree.absolute()
    if tree.is_dir() and (tree / ".git").exists():
        config = recorded_workspace(config, tree_repository(tree), f"the work tree {tree}")
    new_series = config.series_dir(onto_version)
    check_start(config, from_version, onto_version, new_series, force_series)
    if not tree.exists() or (tree.is_dir() and not any(tree.iterdir())):
        log(f"materializing {from_version} into {tree}")
        materialize(config, from_version, tree)
    git_dir = _open_tree(tree)
    branch = check_tree(tree, git_dir, from_version)
    picks = [
        Pick(commit=c.sha, subject=c.subject, change=c.change, part=c.part)
        for c in series_commits(tree, tag_for(from_version))
    ]
    ensure_upstream(config, config.base(onto_version))
    refs = [branch, f"refs/tags/{tag_for(onto_version)}", backup_ref(from_version)]
    state = RebaseState(
        from_version=from_version,
        onto_version=onto_version,
        branch=branch,
        orig_head=_head(tree),
        orig_refs={ref: _rev(tree, ref) for ref in [*refs, import_ref(onto_version)]},
        orig_base=from_version,
        backup_ref=backup_ref(from_version),
        series_dir=str(new_series),
        old_series_dir=str(config.series_dir(from_version)),
        picks=picks,
        phase=IMPORTING,
        review_path=str(review.absolute()) if review else "",
    )
    save_state(git_dir, state)
    msg = f"vllm-fork rebase onto {onto_version}"
    run_git(["update-ref", "--create-reflog", "-m", msg, state.backup_ref, state.orig_head], tree)
    log(f"pre-rebase state kept in {state.backup_ref} ({state.orig_head[:12]})")
    return _run(config, tree, git_dir, state, log)


# --- the steps ---------------------------------------------------------------------


def _step_import(config: Workspace, tree: Path, git_dir: Path, state: RebaseState, log: Log):
    parent = _rev(tree, f"refs/tags/{tag_for(state.from_version)}")
    if parent is None:
        raise WorkTreeError(f"{tree} lost its tag {tag_for(state.from_version)}")
    log(f"importing upstream {state.onto_version} on top of {tag_for(state.from_version)}")
    # Again on --continue after an interruption: the cache may have changed meanwhile.
    ensure_upstream(config, config.base(state.onto_version))
    commit = stack_upstream(config, tree, state.onto_version, parent)
    run_git(["update-ref", f"refs/tags/{tag_for(state.onto_version)}", commit], cwd=tree)
    findings = probe_upstream(tree, commit)
    todo = []
    for p in state.picks:
        found, reason, *_ = findings.get(p.change, ("", ""))
        if p.part == "change" and found == "present":
            p.result, p.detail = ABSORBED, f"upstream {state.onto_version} has it: {reason}"
            todo.append(f"drop {p.commit}")
        else:
            todo += [f"pick {p.commit}", "break"]
    (git_dir / TODO_FILE).write_text("\n".join(todo or ["noop"]) + "\n")
    state.upstream_commit = commit
    state.expect_head = commit
    state.phase = PICKING
    save_state(git_dir, state)


def _git_rebase(tree: Path, git_dir: Path, *args: str) -> str:
    """Run one ``git rebase`` command: "break" (stopped at a break), "conflict" or "done"."""
    editor = f"cp {shlex.quote(str(git_dir / TODO_FILE))}"
    proc = run_git(
        [*_GIT_CONFIG, "rebase", *args],
        cwd=tree,
        env=work_env(GIT_SEQUENCE_EDITOR=editor),
        check=False,
    )
    if proc.returncode != 0:
        if unmerged_stages(tree):
            return CONFLICT
        detail = proc.stderr.decode(errors="replace").strip()
        raise GitError(f"git rebase {' '.join(args[:1])} failed: {detail}")
    return "break" if _rebasing(git_dir) else "done"


def _rebasing(git_dir: Path) -> bool:
    return (git_dir / "rebase-merge").is_dir()


def _done(git_dir: Path) -> list[str]:
    """The todo lines git has done (empty when no rebase is in progress)."""
    done = git_dir / "rebase-merge" / "done"
    return [ln.strip() for ln in done.read_text().splitlines()] if done.is_file() else []


def _last_pick(git_dir: Path, state: RebaseState) -> int:
    """Index of the last patch git picked (-1: none yet)."""
    shas = [p.commit for p in state.picks]
    last = -1
    for words in map(str.split, _done(git_dir)):
        if len(words) > 1 and words[0] in ("pick", "p") and words[1] in shas:
            last = shas.index(words[1])
    return last


def _requeue(git_dir: Path) -> bool:
    """git was stopped inside a pick (its line is done, the pick is not): do it again."""
    done = _done(git_dir)
    if not done or done[-1].split()[0] not in ("pick", "p"):
        return False
    todo = git_dir / "rebase-merge" / "git-rebase-todo"
    todo.write_text(f"{done[-1]}\n{todo.read_text()}")
    return True


def _recommit(tree: Path, source: str, parent: str) -> str:
    """``source``'s tree, author and message on ``parent``; the fork as committer,
    committer date = author date."""
    name, email, date = git_out(
        ["log", "-1", "--date=raw", "--format=%an%x00%ae%x00%ad", source], cwd=tree
    ).split("\0")
    env = git_env(
        commit_identity(author=(name, email), author_date=date, committer_date=date),
        isolated=True,
    )
    message = run_git(["cat-file", "commit", source], cwd=tree).stdout.partition(b"\n\n")[2]
    tree_id = git_out(["rev-parse", f"{source}^{{tree}}"], cwd=tree)
    args = ["commit-tree", tree_id, "-p", parent]
    return run_git(args, cwd=tree, env=env, input=message).stdout.decode().strip()


def _normalize(tree: Path, base: str) -> str:
    """Rewrite base..HEAD with the fork as committer (trees and messages kept)."""
    head = _head(tree)
    parent = base
    for commit in git_out(["rev-list", "--reverse", f"{base}..{head}"], cwd=tree).split():
        parent = _recommit(tree, commit, parent)
    if parent != head:
        run_git(["update-ref", "-m", "vllm-fork rebase: record", "HEAD", parent, head], cwd=tree)
    return parent


def _record(tree: Path, git_dir: Path, state: RebaseState, upto: int, log: Log) -> None:
    """Record every patch up to #``upto`` that git has gone past."""
    while state.next <= upto:
        current = state.picks[state.next]
        if not current.result:  # git picked it (the others were drops or --skip)
            if _head(tree) == state.expect_head:
                current.result = ABSORBED
                current.detail = "the 3-way merge left nothing to change"
            else:
                new = _normalize(tree, state.expect_head)
                how = current.detail or pick_detail(tree, current.commit, state.expect_head, new)
                current.result, current.detail, current.new_commit = APPLIED, how, new
            state.expect_head = _head(tree)
        log(
            f"[{state.next + 1}/{len(state.picks)}] {current.result:<8} {current.subject}  "
            f"({current.detail})"
        )
        state.next += 1
        save_state(git_dir, state)
        faults.point("rebase.pick")


def _stop(tree: Path, git_dir: Path, state: RebaseState, at: int, log: Log) -> None:
    """git stopped on a conflict in patch #``at``: record it and report."""
    _record(tree, git_dir, state, at - 1, log)
    findings = probe_upstream(tree, state.upstream_commit)
    conflicts = describe_stop(tree, state, at, findings)
    state.phase = CONFLICT
    state.conflict = [c.to_json() for c in conflicts]
    save_state(git_dir, state)
    raise RebaseConflict(conflict_report(state, conflicts, tree))


def _run(
    config: Workspace,
    tree: Path,
    git_dir: Path,
    state: RebaseState,
    log: Log,
    command: tuple[str, ...] = (),
) -> RebaseResult:
    if state.phase == IMPORTING:
        _step_import(config, tree, git_dir, state, log)
    if state.phase == PICKING:
        branch = state.branch.removeprefix("refs/heads/")
        requeued = False
        if command:
            where = _git_rebase(tree, git_dir, *command)
        elif _rebasing(git_dir):
            where = CONFLICT if unmerged_stages(tree) else "break"
            if where == "break" and status_lines(tree):
                log(f"resetting a pick of #{state.next + 1} that was interrupted")
                run_git(["reset", "-q", "--hard", "HEAD"], cwd=tree, env=work_env())
                requeued = _requeue(git_dir)
        elif _rev(tree, state.branch) == state.orig_head:  # git rebase did not start
            start = ["-i", "--empty=drop", "--no-autosquash", "--no-update-refs", "--no-verify"]
            start += ["--onto", state.upstream_commit, tag_for(state.from_version), branch]
            where = _git_rebase(tree, git_dir, *start)
        else:
            where = "done"
        while where == "break":
            _record(tree, git_dir, state, _last_pick(git_dir, state) - requeued, log)
            requeued = False
            where = _git_rebase(tree, git_dir, "--continue")
        if where == CONFLICT:
            _stop(tree, git_dir, state, _last_pick(git_dir, state), log)
        _record(tree, git_dir, state, len(state.picks) - 1, log)
        state.phase = FINISHING
        save_state(git_dir, state)
    if state.phase != FINISHING:
        raise WorkTreeError(f"the rebase is in phase {state.phase!r}; cannot finish it")
    return _step_finish(config, tree, git_dir, state, log)


def _step_finish(
    config: Workspace, tree: Path, git_dir: Path, state: RebaseState, log: Log
) -> RebaseResult:
    head = _head(tree)
    if _rev(tree, state.branch) != head:
        msg = f"vllm-fork rebase onto {state.onto_version}"
        run_git(["update-ref", "-m", msg, state.branch, head], cwd=tree)
    run_git(["symbolic-ref", "HEAD", state.branch], cwd=tree)
    run_git(["config", BASE_KEY, state.onto_version], cwd=tree)
    if state.files_before is None:
        series_dir = Path(state.series_dir)
        state.files_before = {str(series_dir): "" if series_dir.is_dir() else None}
        state.files_before |= {
            str(p): p.read_bytes().decode("latin-1") for p in _series_files(series_dir)
        }
        save_state(git_dir, state)
    faults.point("rebase.finish")
    # The rebase replaces the onto series on purpose (the review says what was dropped).
    exported = export(config, tree, force=True)
    extra = Path(state.review_path) if state.review_path else None
    try:  # a failure to write the review is reported, never undoes the rebase
        names = old_series_names(state)
        review = [str(p) for p in review_rebase(tree, git_dir, state, names, extra)]
    except (OSError, ForkError) as exc:
        log(f"warning: the rebase review could not be written: {exc}")
        review = []
    clear_state(git_dir)
    (git_dir / TODO_FILE).unlink(missing_ok=True)
    return RebaseResult(state, exported.written, exported.removed, review)


def _series_files(series_dir: Path) -> list[Path]:
    """The files finishing may write (and abort puts back): the store's pool
    (series/store.py) and the onto base's own directory (its series file)."""
    root = series_dir.parent
    dirs = [d for d in (root / store.POOL_DIR, series_dir) if d.is_dir()]
    return [p for d in dirs for p in d.iterdir()]


# --- continue / skip / abort -------------------------------------------------------


def state_workspace(config: Workspace, tree: Path, state: RebaseState) -> Workspace:
    """The workspace of the repository the rebase started from (its state
    records the series directory): its series are written there, whatever
    checkout the command runs from (refused when that is another repository)."""
    recorded = Path(state.series_dir).parent.parent
    return recorded_workspace(config, recorded, f"the rebase in {tree}")


def _in_progress(tree: Path) -> tuple[Path, RebaseState]:
    git_dir = _open_tree(tree)
    state = load_state(git_dir)
    if state is None:
        raise RebaseRefusedError(f"no vllm-fork rebase is in progress in {tree}")
    return git_dir, state


def continue_rebase(
    config: Workspace, tree: Path, *, skip: bool = False, reason: str = "", log: Log = print
) -> RebaseResult:
    """Go on after a conflict (``skip``: drop the conflicted patch, ``reason``
    saying why, for the review) or an interruption."""
    tree = tree.absolute()
    git_dir, state = _in_progress(tree)
    config = state_workspace(config, tree, state)
    if skip and state.phase != CONFLICT:
        raise RebaseRefusedError("--skip drops a patch that stopped on a conflict; there is none")
    command: tuple[str, ...] = ()
    if state.phase == CONFLICT:
        current = state.picks[state.next]
        if skip:
            current.result, current.detail, current.reason = ABSORBED, SKIPPED, reason.strip()
            command = ("--skip",)
        else:
            current.detail = check_resolution(tree, state)
            # ``git rebase --continue`` run by hand already took it to the pick's break
            command = () if _done(git_dir)[-1:] == ["break"] else ("--continue",)
        state.conflict = []
        state.phase = PICKING
        save_state(git_dir, state)
    return _run(config, tree, git_dir, state, log, command)


def abort_rebase(config: Workspace, tree: Path, *, log: Log = print) -> RebaseState:
    """Put branch, HEAD, refs, the recorded base and series/<V2>/ back as they were."""
    tree = tree.absolute()
    git_dir, state = _in_progress(tree)
    if _rebasing(git_dir):
        run_git(["rebase", "--quit"], cwd=tree, env=work_env())
    for ref, value in state.orig_refs.items():
        if value is None:
            if _rev(tree, ref) is not None or ref_exists(git_dir, ref):
                run_git(["update-ref", "-d", ref], cwd=tree)
        elif _rev(tree, ref) != value:
            run_git(["update-ref", "-m", "vllm-fork rebase --abort", ref, value], cwd=tree)
    run_git(["symbolic-ref", "HEAD", state.branch], cwd=tree)
    run_git(["reset", "-q", "--hard", state.orig_head], cwd=tree, env=work_env())
    for name in ("MERGE_MSG", "AUTO_MERGE", "CHERRY_PICK_HEAD", "REBASE_HEAD", TODO_FILE):
        (git_dir / name).unlink(missing_ok=True)
    run_git(["config", BASE_KEY, state.orig_base], cwd=tree)
    if state.files_before is not None:  # finishing wrote series/<V2>: put it back
        series_dir = Path(state.series_dir)
        saved = {
            Path(name): text.encode("latin-1")
            for name, text in state.files_before.items()
            if name != str(series_dir) and text is not None
        }
        store.restore_base(series_dir.parent, series_dir.name, saved)
    clear_state(git_dir)
    log(
        f"rebase aborted: {tree} is back at {state.orig_head[:12]} "
        f"({state.branch.removeprefix('refs/heads/')}, base {state.orig_base})"
    )
    return state
