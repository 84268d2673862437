"""`vllm-fork rebase`: move a work tree's series from upstream V1 onto V2.

The whole state machine is in this file. Around it: ``state.py`` writes the
state to disk, ``replay.py`` replays one commit (3-way cherry-pick),
``conflicts.py`` describes a stop, ``cli/rebase.py`` is the front end.

::

    start_rebase: checks, backup ref, state file
      |
      v
    IMPORTING --_step_import: V2 on top of V1, HEAD detached--+
                                                              |
      +-------------------------------------------------------+
      v
    PICKING --_step_picks: patch i applied or absorbed--> PICKING (i + 1)
      |   |
      |   +--3-way conflict--> CONFLICT --continue (_resolve): applied--> PICKING (i + 1)
      |                                 --skip (_skip): dropped---------> PICKING (i + 1)
      | every patch replayed
      v
    FINISHING --_step_finish: branch, base V2, export, history--> done

    --abort (abort_rebase), from any phase: refs, HEAD, recorded base and
    the series files written so far are put back exactly as they were.
    --continue after a crash resumes the phase the state file names (_run).

Steps (each one recorded in ``.git/vllm-fork-rebase.json`` before it runs,
so that ``--continue`` and ``--abort`` work after a stop or a crash):

1. checks: a clean work tree of V1 on a branch, V2 pinned, no series/V2 yet;
   the pre-rebase HEAD is kept in ``refs/vllm-fork/pre-rebase/<V1>``;
2. import: upstream V2's tree committed on top of ``upstream/V1`` (tagged
   ``upstream/V2`` in the work tree) and checked out, HEAD detached;
3. replay: each series commit in order. A ``Fork-Part: change`` patch whose
   change the probes find in V2 is dropped (absorbed); every other patch is
   cherry-picked with a 3-way merge. A pick that leaves nothing to change is
   absorbed too; a conflict stops for the user;
4. finish: the branch moves to the result, the tree records base V2,
   series/<V2>/ is exported and the absorbed patches are recorded;
5. review: rebase/review.py writes what became of each patch (unchanged,
   changed with its interdiff, absorbed with the evidence, dropped by hand
   with the reason) and the files upstream moved under the series, as
   Markdown and JSON.

A patch that stops on a conflict although upstream V2 already has what it
brings (facts/lifecycle.py: retire-ready) is proposed for ``--skip``.
"""

from __future__ import annotations

import fcntl
import re
import shlex
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vllm_fork import faults
from vllm_fork.errors import (
    ForkError,
    RebaseRefusedError,
    UnknownVersionError,
    UsageError,
    WorkTreeError,
)
from vllm_fork.facts.lifecycle import retirement
from vllm_fork.facts.names import tag_for
from vllm_fork.git import git_env, git_out, ref_exists, run_git
from vllm_fork.probes import GitTree, probe_all
from vllm_fork.rebase.conflicts import (
    FileConflict,
    describe_conflicts,
    format_conflicts,
    note_added_by_dropped,
    unmerged_stages,
)
from vllm_fork.rebase.replay import CONFLICT as PICK_CONFLICT
from vllm_fork.rebase.replay import EMPTY, clear_leftovers, commit_index, normalize, pick, work_env
from vllm_fork.rebase.replay import git_dir as find_git_dir
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
from vllm_fork.series.history import Absorbed, mark_applied_upstream, write_series_history
from vllm_fork.series.patches import load_series
from vllm_fork.sources.pins import check_version
from vllm_fork.sources.upstream import ensure_upstream
from vllm_fork.sources.workspace import Workspace, recorded_workspace
from vllm_fork.tree.commits import read_commits, series_commits
from vllm_fork.tree.export import export
from vllm_fork.tree.materialize import BASE_KEY, materialize, tree_repository
from vllm_fork.tree.stacking import import_ref, stack_upstream

BACKUP_PREFIX = "refs/vllm-fork/pre-rebase/"
LOCK_FILE = "vllm-fork-rebase.lock"
IN_PROGRESS = (
    "CHERRY_PICK_HEAD",
    "MERGE_HEAD",
    "REVERT_HEAD",
    "rebase-apply",
    "rebase-merge",
    "BISECT_LOG",
)
_MARKER = re.compile(rb"^(<<<<<<<|>>>>>>>)( |$)", re.MULTILINE)

Log = Callable[[str], None]


class RebaseConflict(ForkError):
    """The replay stopped on a conflict; the message is the report for the user."""


@dataclass
class RebaseResult:
    state: RebaseState
    written: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    old_series_updated: list[str] = field(default_factory=list)
    review: list[str] = field(default_factory=list)  # files the review was written to


# --- helpers -----------------------------------------------------------------------


def backup_ref(version: str) -> str:
    return f"{BACKUP_PREFIX}{version}"


def _rev(tree: Path, rev: str) -> str | None:
    proc = run_git(["rev-parse", "--verify", "-q", f"{rev}^{{commit}}"], cwd=tree, check=False)
    return proc.stdout.decode().strip() if proc.returncode == 0 else None


def _head(tree: Path) -> str:
    return git_out(["rev-parse", "HEAD"], cwd=tree)


def _status(tree: Path) -> list[str]:
    out = git_out(
        ["status", "--porcelain", "--untracked-files=normal"], cwd=tree, env=git_env(isolated=True)
    )
    return out.splitlines()


def _arg(tree: Path | None) -> str:
    """``tree`` as a shell argument of the commands the messages propose."""
    return shlex.quote(str(tree))


def _shown(lines: list[str], limit: int = 10) -> str:
    more = f"\n  ... and {len(lines) - limit} more" if len(lines) > limit else ""
    return "\n  ".join(lines[:limit]) + more


@contextmanager
def _tree_lock(git_dir: Path) -> Iterator[None]:
    with open(git_dir / LOCK_FILE, "a+b") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise WorkTreeError(
                f"another vllm-fork rebase is running on {git_dir.parent}"
            ) from None
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _tree_base(tree: Path) -> str | None:
    proc = run_git(["config", "--get", BASE_KEY], cwd=tree, check=False)
    if proc.returncode != 0:
        return None
    return proc.stdout.decode().strip() or None


def _open_tree(tree: Path) -> Path:
    """The git dir of an existing work tree (error if ``tree`` is not one)."""
    if not tree.is_dir():
        raise WorkTreeError(f"{tree} is not a directory")
    proc = run_git(["rev-parse", "--show-toplevel"], cwd=tree, check=False)
    if proc.returncode != 0 or Path(proc.stdout.decode().strip()).resolve() != tree.resolve():
        raise WorkTreeError(f"{tree} is not the top of a git work tree")
    return find_git_dir(tree)


def probe_upstream(tree: Path, commit: str) -> dict[str, tuple[Any, ...]]:
    """change id -> (state, reason, hardening) of the probes on a commit of the work tree."""
    return {
        cid: (f.state, f.reason, dict(f.hardening))
        for cid, f in probe_all(GitTree(tree, commit)).items()
    }


def _retire_evidence(
    findings: dict[str, tuple[Any, ...]], current: Pick, release: str
) -> dict[str, str] | None:
    """The lifecycle evidence that upstream ``release`` makes ``current`` redundant."""
    state, reason, *rest = findings.get(current.change, ("", ""))
    hardening = rest[0] if rest else None
    hit = retirement(current.change, current.part, state, reason, hardening, release)
    return hit.to_json() if hit else None


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


# --- start -------------------------------------------------------------------------


def _check_versions(config: Workspace, from_version: str, onto_version: str) -> None:
    check_version(from_version)
    check_version(onto_version)
    if from_version == onto_version:
        raise UsageError(f"--from and --onto are both {from_version}")
    try:
        config.base(onto_version)
    except UnknownVersionError as exc:
        raise UnknownVersionError(f"{exc}; run `vllm-fork pin {onto_version}` first") from None


def _check_clean(tree: Path, git_dir: Path) -> None:
    busy = [name for name in IN_PROGRESS if (git_dir / name).exists()]
    if busy:
        raise RebaseRefusedError(
            f"{tree} is in the middle of a git operation ({', '.join(busy)}); finish it first"
        )
    dirty = _status(tree)
    if dirty:
        raise RebaseRefusedError(
            f"{tree} has uncommitted changes or untracked files; commit, stash or remove "
            f"them before rebasing (nothing was changed):\n  {_shown(dirty)}"
        )


def _series_commits(tree: Path, from_version: str) -> list[Pick]:
    return [
        Pick(commit=c.sha, subject=c.subject, change=c.change, part=c.part)
        for c in series_commits(tree, tag_for(from_version))
    ]


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
    _check_versions(config, from_version, onto_version)
    new_series = config.series_dir(onto_version)
    if not force_series and (
        store.has_series(config.series_root, onto_version) or any(new_series.glob("*.patch"))
    ):
        raise RebaseRefusedError(
            f"{new_series} already exists; a rebase would overwrite it (pass --force-series "
            "to replace it)"
        )
    if not tree.exists() or (tree.is_dir() and not any(tree.iterdir())):
        log(f"materializing {from_version} into {tree}")
        materialize(config, from_version, tree)
    git_dir = _open_tree(tree)
    with _tree_lock(git_dir):
        existing = load_state(git_dir)
        if existing is not None:
            raise RebaseRefusedError(
                f"a rebase from {existing.from_version} onto {existing.onto_version} is in "
                f"progress in {tree}; run `vllm-fork rebase --continue {_arg(tree)}` or "
                f"`vllm-fork rebase --abort {_arg(tree)}`"
            )
        base = _tree_base(tree)
        if base != from_version:
            if base is None:
                raise RebaseRefusedError(
                    f"{tree} is not a work tree made by `vllm-fork materialize` (it records no "
                    "base); give the work tree as DIR (`vllm-fork rebase --from V1 --onto V2 "
                    "DIR`), or a new directory to materialize V1 into"
                )
            raise RebaseRefusedError(f"{tree} is a work tree of {base}, not {from_version}")
        _check_clean(tree, git_dir)
        proc = run_git(["symbolic-ref", "-q", "HEAD"], cwd=tree, check=False)
        branch = proc.stdout.decode().strip() if proc.returncode == 0 else ""
        if not branch.startswith("refs/heads/"):
            raise RebaseRefusedError(f"HEAD of {tree} is detached; check out the series branch")
        picks = _series_commits(tree, from_version)
        ensure_upstream(config, config.base(onto_version))

        refs = [
            branch,
            f"refs/tags/{tag_for(onto_version)}",
            backup_ref(from_version),
            import_ref(onto_version),
        ]
        state = RebaseState(
            from_version=from_version,
            onto_version=onto_version,
            branch=branch,
            orig_head=_head(tree),
            orig_refs={ref: _rev(tree, ref) for ref in refs},
            orig_base=from_version,
            backup_ref=backup_ref(from_version),
            series_dir=str(new_series),
            old_series_dir=str(config.series_dir(from_version)),
            picks=picks,
            phase=IMPORTING,
            review_path=str(review.absolute()) if review else "",
        )
        save_state(git_dir, state)
        run_git(
            [
                "update-ref",
                "--create-reflog",
                "-m",
                f"vllm-fork rebase onto {onto_version}",
                state.backup_ref,
                state.orig_head,
            ],
            cwd=tree,
        )
        log(f"pre-rebase state kept in {state.backup_ref} ({state.orig_head[:12]})")
        return _run(config, tree, git_dir, state, log)


# --- the steps ---------------------------------------------------------------------


def _step_import(
    config: Workspace, tree: Path, git_dir: Path, state: RebaseState, log: Log
) -> None:
    parent = _rev(tree, f"refs/tags/{tag_for(state.from_version)}")
    if parent is None:
        raise WorkTreeError(f"{tree} lost its tag {tag_for(state.from_version)}")
    log(f"importing upstream {state.onto_version} on top of {tag_for(state.from_version)}")
    # Again on --continue after an interruption: the cache may have changed meanwhile.
    ensure_upstream(config, config.base(state.onto_version))
    commit = stack_upstream(config, tree, state.onto_version, parent)
    run_git(["update-ref", f"refs/tags/{tag_for(state.onto_version)}", commit], cwd=tree)
    # -f: the tree was clean when the rebase started; anything here is a half-done checkout.
    run_git(["checkout", "-q", "-f", "--detach", commit], cwd=tree, env=work_env())
    state.upstream_commit = commit
    state.phase = PICKING
    state.next = 0
    state.expect_head = commit
    save_state(git_dir, state)


def _recover_pick(tree: Path, state: RebaseState, log: Log) -> bool:
    """Bring HEAD to a defined point after an interruption; True if pick #next is done."""
    head = _head(tree)
    current = state.picks[state.next]
    if head != state.expect_head:
        parent = _rev(tree, "HEAD^")
        messages = {c.sha: c.message for c in read_commits(tree, [head, current.commit])}
        same = messages.get(head) == messages.get(current.commit)
        if parent == state.expect_head and same and not _status(tree):
            current.result, current.detail, current.new_commit = APPLIED, "applied", head
            return True
        raise WorkTreeError(
            f"HEAD of {tree} moved to {head[:12]} outside the rebase; expected "
            f"{state.expect_head[:12]}: run `vllm-fork rebase --abort {_arg(tree)}`"
        )
    if _status(tree) or unmerged_stages(tree):
        log(f"resetting a pick of #{state.next + 1} that was interrupted")
        run_git(["reset", "-q", "--hard", state.expect_head], cwd=tree, env=work_env())
        clear_leftovers(tree)
    return False


def _added_by_absorbed(tree: Path, done: list[Pick]) -> dict[str, str]:
    """Files that the absorbed patches among ``done`` added, each with its patch's subject."""
    added: dict[str, str] = {}
    absorbed = [p for p in done if p.result == ABSORBED]
    commits = {c.sha: c for c in read_commits(tree, [p.commit for p in absorbed])}
    for p in absorbed:
        for name in commits[p.commit].paths("A"):
            added.setdefault(name, p.subject)
    return added


def _step_picks(tree: Path, git_dir: Path, state: RebaseState, log: Log) -> None:
    findings: dict[str, tuple[Any, ...]] | None = None
    total = len(state.picks)
    check = True  # only the first pick of a run can follow an interruption
    while state.next < total:
        current = state.picks[state.next]
        number = f"[{state.next + 1}/{total}]"
        done = check and _recover_pick(tree, state, log)
        check = False
        if not done:
            if current.part == "change":
                if findings is None:
                    findings = probe_upstream(tree, state.upstream_commit)
                found, reason, *_ = findings.get(current.change, ("", ""))
                if found == "present":
                    current.result = ABSORBED
                    current.detail = f"upstream {state.onto_version} has it: {reason}"
            if not current.result:
                outcome = pick(tree, current.commit)
                if outcome.status == PICK_CONFLICT:
                    if findings is None:
                        findings = probe_upstream(tree, state.upstream_commit)
                    current.retire = _retire_evidence(findings, current, state.onto_version)
                    conflicts = describe_conflicts(tree)
                    note_added_by_dropped(
                        conflicts,
                        _added_by_absorbed(tree, state.picks[: state.next]),
                        f"upstream {state.onto_version}",
                    )
                    state.phase = CONFLICT
                    state.conflict = [c.to_json() for c in conflicts]
                    save_state(git_dir, state)
                    raise RebaseConflict(conflict_report(state, conflicts, tree))
                if outcome.status == EMPTY:
                    current.result = ABSORBED
                    current.detail = outcome.detail
                else:
                    current.result = APPLIED
                    current.detail = outcome.detail
                    current.new_commit = outcome.commit
        log(f"{number} {current.result:<8} {current.subject}  ({current.detail})")
        state.next += 1
        state.expect_head = _head(tree)
        save_state(git_dir, state)
        faults.point("rebase.pick")
    state.phase = FINISHING
    save_state(git_dir, state)


def _step_finish(
    config: Workspace, tree: Path, git_dir: Path, state: RebaseState, log: Log
) -> RebaseResult:

    head = _head(tree)
    current = _rev(tree, state.branch)
    if current != head:
        run_git(
            ["update-ref", "-m", f"vllm-fork rebase onto {state.onto_version}", state.branch, head],
            cwd=tree,
        )
    run_git(["symbolic-ref", "HEAD", state.branch], cwd=tree)
    run_git(["config", BASE_KEY, state.onto_version], cwd=tree)

    old_series = Path(state.old_series_dir)
    names = _old_series_names(old_series)
    absorbed = [
        Absorbed(
            names.get(p.subject, p.subject), p.change, p.part, p.detail, by_hand=p.detail == SKIPPED
        )
        for p in state.picks
        if p.result == ABSORBED
    ]
    if state.files_before is None:
        state.files_before = _snapshot(
            Path(state.series_dir), [old_series / a.patch for a in absorbed]
        )
        save_state(git_dir, state)
    faults.point("rebase.finish")
    # The rebase replaces the onto series on purpose (absorbed patches are recorded below).
    exported = export(config, tree, force=True)
    write_series_history(Path(state.series_dir), state.onto_version, absorbed)
    updated = mark_applied_upstream(
        old_series,
        [e.patch for e in absorbed if not e.by_hand and e.patch.endswith(".patch")],
        state.onto_version,
    )
    review = _write_review(config, tree, git_dir, state, log)
    clear_state(git_dir)
    return RebaseResult(state, exported.written, exported.removed, updated, review)


def _write_review(
    config: Workspace, tree: Path, git_dir: Path, state: RebaseState, log: Log
) -> list[str]:
    """Write the review; a failure to write it is reported, never undoes the rebase."""
    extra = Path(state.review_path) if state.review_path else None
    try:
        return [str(p) for p in review_rebase(tree, git_dir, state, old_series_names(state), extra)]
    except (OSError, ForkError) as exc:
        log(f"warning: the rebase review could not be written: {exc}")
        return []


def _run(
    config: Workspace, tree: Path, git_dir: Path, state: RebaseState, log: Log
) -> RebaseResult:
    if state.phase == IMPORTING:
        _step_import(config, tree, git_dir, state, log)
    if state.phase == PICKING:
        _step_picks(tree, git_dir, state, log)
    if state.phase != FINISHING:
        raise WorkTreeError(f"the rebase is in phase {state.phase!r}; cannot finish it")
    return _step_finish(config, tree, git_dir, state, log)


def _store_files(series_dir: Path) -> list[Path]:
    """The files of series/ that finishing may write: the index, the pool, and the
    legacy files of the onto base (series/store.py)."""
    root = series_dir.parent
    files = [root / store.INDEX_FILE]
    for directory in (root / store.POOL_DIR, series_dir):
        if directory.is_dir():
            files.extend(p for p in directory.iterdir() if p.is_file())
    return files


def _snapshot(series_dir: Path, files: list[Path]) -> dict[str, str | None]:
    """Contents (bytes as latin-1 text) of what finishing may write; None: absent."""
    paths: dict[str, str | None] = {str(series_dir): None}
    if series_dir.is_dir():
        paths[str(series_dir)] = ""
    for path in [*files, *_store_files(series_dir)]:
        if path.is_file():
            paths[str(path)] = path.read_bytes().decode("latin-1")
    return paths


def _restore_files(state: RebaseState) -> None:
    """Undo what finishing wrote to series/ (the index, the pool, series/<V2>/)."""
    before = state.files_before
    if before is None:
        return
    series_dir = Path(state.series_dir)
    for path in _store_files(series_dir):
        if str(path) not in before:
            path.unlink(missing_ok=True)
    if (
        before.get(str(series_dir)) is None
        and series_dir.is_dir()
        and not any(series_dir.iterdir())
    ):
        series_dir.rmdir()
    for name, text in before.items():
        path = Path(name)
        if name != str(series_dir) and text is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(text.encode("latin-1"))


# --- continue / abort --------------------------------------------------------------


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


def _resolve(tree: Path, state: RebaseState) -> None:
    """Take the user's resolution of the conflicted pick (committed or staged)."""
    current = state.picks[state.next]
    unmerged = sorted(unmerged_stages(tree))
    if unmerged:
        raise WorkTreeError(
            "these files still have conflicts; edit them, then `git add` them (or commit):\n  "
            + _shown(unmerged)
        )
    head = _head(tree)
    if head != state.expect_head:
        if run_git(
            ["merge-base", "--is-ancestor", state.expect_head, head], cwd=tree, check=False
        ).returncode:
            raise WorkTreeError(
                f"HEAD {head[:12]} does not descend from the rebase's {state.expect_head[:12]}; "
                f"reset to it, or `vllm-fork rebase --abort {_arg(tree)}`"
            )
        dirty = _status(tree)
        if dirty:
            raise WorkTreeError(
                "you committed part of the resolution; commit or discard the rest:\n  "
                + _shown(dirty)
            )
        count = len(git_out(["rev-list", f"{state.expect_head}..{head}"], cwd=tree).split())
        current.new_commit = normalize(tree, state.expect_head)
        current.result = APPLIED
        current.detail = f"conflict resolved by hand ({count} commit(s))"
        clear_leftovers(tree)
        return
    unstaged = [line for line in _status(tree) if line[1] != " " or line.startswith("??")]
    if unstaged:
        raise WorkTreeError(
            "stage the resolution (`git add`) or discard the rest; not staged:\n  "
            + _shown(unstaged)
        )
    for conflict in state.conflict:
        path = conflict["path"]
        blob = run_git(["show", f":{path}"], cwd=tree, check=False)
        if blob.returncode == 0 and _MARKER.search(blob.stdout):
            raise WorkTreeError(f"{path} still contains conflict markers; fix it and `git add` it")
    index_tree = git_out(["write-tree"], cwd=tree, env=work_env())
    if index_tree == git_out(["rev-parse", "HEAD^{tree}"], cwd=tree):
        raise WorkTreeError(
            "nothing is staged: the resolution would drop the patch. Stage the resolved "
            f"files (`git add`), or run `vllm-fork rebase --skip --reason TEXT {_arg(tree)}` "
            "if upstream "
            "already has it"
        )
    current.new_commit = commit_index(tree, current.commit)
    current.result = APPLIED
    current.detail = "3-way merge, conflict resolved by hand"


def _skip(tree: Path, state: RebaseState, reason: str) -> None:
    """Drop the conflicted patch: back to the state before its pick."""
    run_git(["reset", "-q", "--hard", state.expect_head], cwd=tree, env=work_env())
    clear_leftovers(tree)
    current = state.picks[state.next]
    current.result = ABSORBED
    current.detail = SKIPPED
    current.reason = reason.strip()


def continue_rebase(
    config: Workspace, tree: Path, *, skip: bool = False, reason: str = "", log: Log = print
) -> RebaseResult:
    """Go on after a conflict (``skip``: drop the conflicted patch, ``reason``
    saying why, for the review) or an interruption."""
    tree = tree.absolute()
    git_dir, state = _in_progress(tree)
    config = state_workspace(config, tree, state)
    with _tree_lock(git_dir):
        if skip and state.phase != CONFLICT:
            raise RebaseRefusedError(
                "--skip drops a patch that stopped on a conflict; there is none"
            )
        if state.phase == CONFLICT:
            if skip:
                _skip(tree, state, reason)
            else:
                _resolve(tree, state)
            current = state.picks[state.next]
            log(
                f"[{state.next + 1}/{len(state.picks)}] {current.result:<8} {current.subject}  "
                f"({current.detail})"
            )
            state.next += 1
            state.expect_head = _head(tree)
            state.conflict = []
            state.phase = PICKING
            save_state(git_dir, state)
        return _run(config, tree, git_dir, state, log)


def abort_rebase(config: Workspace, tree: Path, *, log: Log = print) -> RebaseState:
    """Put branch, HEAD, refs, the recorded base and the work tree back as they were."""
    tree = tree.absolute()
    git_dir, state = _in_progress(tree)
    with _tree_lock(git_dir):
        for ref, value in state.orig_refs.items():
            if value is None:
                if _rev(tree, ref) is not None or ref_exists(git_dir, ref):
                    run_git(["update-ref", "-d", ref], cwd=tree)
            elif _rev(tree, ref) != value:
                run_git(["update-ref", "-m", "vllm-fork rebase --abort", ref, value], cwd=tree)
        run_git(["symbolic-ref", "HEAD", state.branch], cwd=tree)
        run_git(["reset", "-q", "--hard", state.orig_head], cwd=tree, env=work_env())
        clear_leftovers(tree)
        run_git(["config", BASE_KEY, state.orig_base], cwd=tree)
        _restore_files(state)
        clear_state(git_dir)
    log(
        f"rebase aborted: {tree} is back at {state.orig_head[:12]} "
        f"({state.branch.removeprefix('refs/heads/')}, base {state.orig_base})"
    )
    return state


# --- reports -----------------------------------------------------------------------


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
