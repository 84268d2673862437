"""`vllm-fork rebase` on synthetic upstream releases (no network)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from vllm_fork.cli.main import main
from vllm_fork.errors import UnknownVersionError, WorkTreeError
from vllm_fork.rebase import engine as rebase_mod
from vllm_fork.rebase.engine import (
    RebaseConflict,
    abort_rebase,
    continue_rebase,
    start_rebase,
)
from vllm_fork.rebase.state import STATE_FILE
from vllm_fork.series import store
from vllm_fork.series.patches import load_series, parse_patch
from vllm_fork.tree.materialize import materialize

try:
    from .rebase_support import (
        CLEAN_SERIES,
        CONFLICT_SERIES,
        KEEP_FORK,
        KEEP_UPSTREAM,
        KERNEL,
        MOE,
        MOE_HARDENING,
        OPS,
        OTHER,
        ROPE,
        V1,
        V1_FILES,
        V2,
        V2_FILES,
        Fork,
        PatchSpec,
        git,
        make_fork,
        resolve,
        series_files,
        snapshot,
    )
    from .seriesutil import stored_patch
except ImportError:
    from rebase_support import (  # type: ignore[no-redef]
        CLEAN_SERIES,
        CONFLICT_SERIES,
        KEEP_FORK,
        KEEP_UPSTREAM,
        KERNEL,
        MOE,
        MOE_HARDENING,
        OPS,
        OTHER,
        ROPE,
        V1,
        V1_FILES,
        V2,
        V2_FILES,
        Fork,
        PatchSpec,
        git,
        make_fork,
        resolve,
        series_files,
        snapshot,
    )
    from seriesutil import stored_patch  # type: ignore[no-redef]


def quiet(_: str) -> None:
    pass


@pytest.fixture
def fork(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Fork:
    return make_fork(tmp_path, monkeypatch, {V1: V1_FILES, V2: V2_FILES}, default=V1)


def results(state) -> list[tuple[str, str]]:
    return [(p.subject, p.result) for p in state.picks]


def test_clean_rebase_applies_follows_rename_and_absorbs(fork: Fork, tmp_path: Path) -> None:
    fork.write_series(V1, CLEAN_SERIES)
    old_series = series_files(fork.series_dir(V1))
    tree = tmp_path / "tree"
    materialize(fork.config, V1, tree)

    result = start_rebase(fork.config, V1, V2, tree, log=quiet)

    picks = {p.subject: p for p in result.state.picks}
    assert picks[OTHER.subject].result == "applied"
    assert picks[OTHER.subject].detail == "clean"
    assert picks[OPS.subject].result == "applied"
    assert picks[OPS.subject].detail.startswith("3-way merge")
    kernel = picks[KERNEL.subject]
    assert kernel.result == "applied"
    assert "csrc/pos_encoding_kernels.cu -> csrc/libtorch_stable/pos_encoding_kernels.cu" in (
        kernel.detail
    )
    assert picks[MOE.subject].result == "absorbed"
    assert picks[MOE_HARDENING.subject].result == "applied"

    # The tree: on the branch, base V2, upstream V2 stacked on upstream V1.
    assert git(tree, "symbolic-ref", "HEAD") == "refs/heads/fork"
    assert git(tree, "config", "vllm-fork.base") == V2
    assert git(tree, "rev-parse", "upstream/1.1.0^") == git(tree, "rev-parse", "upstream/1.0.0")
    assert git(tree, "status", "--porcelain") == ""
    moved = (tree / "csrc/libtorch_stable/pos_encoding_kernels.cu").read_text()
    assert "kernel line 12 patched" in moved
    assert not (tree / "csrc/pos_encoding_kernels.cu").exists()
    moe = (tree / "vllm/moe.py").read_text()
    assert "moe line 25 guarded" in moe and "moe line 5 precast once" in moe
    assert "ops line 18 changed upstream" in (tree / "vllm/ops.py").read_text()
    assert "ops line 20 patched" in (tree / "vllm/ops.py").read_text()
    assert git(tree, "rev-parse", "refs/vllm-fork/pre-rebase/1.0.0") == result.state.orig_head
    assert not (tree / ".git" / STATE_FILE).exists()

    # series/V2: four patches, the order only; the absorbed one is in the review.
    new = load_series(fork.series_dir(V2))
    assert [h.subject for h in new.headers] == [
        OTHER.subject,
        OPS.subject,
        KERNEL.subject,
        MOE_HARDENING.subject,
    ]
    series_text = (fork.series_dir(V2) / "series").read_text()
    assert "Applied-Upstream" not in series_text
    review = json.loads((tree / ".git/vllm-fork/review.json").read_text())
    [absorbed] = [p for p in review["patches"] if p["outcome"] == "absorbed"]
    assert absorbed["patch"].startswith("0004-") and absorbed["change"] == "moe-bias-precast"
    assert absorbed["release"] == V2 and absorbed["part"] == "change"

    # The old series is left as it was: nothing is written back into it.
    assert series_files(fork.series_dir(V1)) == old_series

    # The new series materializes on the cached (parentless) upstream V2 ...
    again = tmp_path / "again"
    materialize(fork.config, V2, again)
    assert git(again, "rev-parse", "HEAD^{tree}") == git(tree, "rev-parse", "HEAD^{tree}")
    # ... and the old one still materializes and exports byte-stable.
    old = tmp_path / "old"
    materialize(fork.config, V1, old)
    from vllm_fork.tree.export import export

    assert not export(fork.config, old).changed


def test_rebase_is_deterministic(fork: Fork, tmp_path: Path) -> None:
    fork.write_series(V1, CLEAN_SERIES)
    heads = []
    for name in ("one", "two"):
        tree = tmp_path / name
        materialize(fork.config, V1, tree)
        start_rebase(fork.config, V1, V2, tree, force_series=True, log=quiet)
        heads.append(git(tree, "rev-parse", "HEAD"))
        committer = git(tree, "log", "-1", "--format=%cn <%ce> %cI|%aI")
        assert committer.split("> ")[1].split("|")[0] == committer.split("|")[1]
    assert heads[0] == heads[1]


def test_change_absorbed_by_probe_keeps_hardening(
    fork: Fork, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Upstream implemented the rope change its own way: the pick would conflict,
    # but the probe recognises it, so the change patch is dropped without a pick.
    hardening = PatchSpec(
        "[ROCm] Harden the rope path",
        "dsv32-decode",
        "hardening",
        {"vllm/rope.py": {20: "rope line 20 hardened"}},
    )
    fork.write_series(V1, [OTHER, ROPE, hardening])
    tree = tmp_path / "tree"
    materialize(fork.config, V1, tree)
    seen = []

    def fake_probe(tree_path: Path, commit: str) -> dict[str, tuple[str, str]]:
        seen.append(git(tree_path, "rev-parse", f"{commit}^{{tree}}"))
        return {"dsv32-decode": ("present", "upstream keys the cache on everything")}

    monkeypatch.setattr("vllm_fork.rebase.engine.probe_upstream", fake_probe)
    result = start_rebase(fork.config, V1, V2, tree, log=quiet)

    assert results(result.state) == [
        (OTHER.subject, "applied"),
        (ROPE.subject, "absorbed"),
        (hardening.subject, "applied"),
    ]
    assert "upstream keys the cache" in result.state.picks[1].detail
    # The probe read upstream V2's pristine tree.
    assert seen == [git(tree, "rev-parse", "upstream/1.1.0^{tree}")]
    rope = (tree / "vllm/rope.py").read_text()
    assert "rope line 10 upstream version" in rope and "rope line 20 hardened" in rope
    assert [h.part for h in load_series(fork.series_dir(V2)).headers] == ["change", "hardening"]


def test_hardening_of_absorbed_change_conflicts_instead_of_dropping(
    fork: Fork, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hardening = PatchSpec(
        "[ROCm] Harden the rope line",
        "dsv32-decode",
        "hardening",
        {"vllm/rope.py": {10: "rope line 10 fork version, hardened"}},
    )
    fork.write_series(V1, [ROPE, hardening])
    tree = tmp_path / "tree"
    materialize(fork.config, V1, tree)
    monkeypatch.setattr(
        "vllm_fork.rebase.engine.probe_upstream",
        lambda *_: {"dsv32-decode": ("present", "found upstream")},
    )
    with pytest.raises(RebaseConflict) as info:
        start_rebase(fork.config, V1, V2, tree, log=quiet)
    report = str(info.value)
    assert "patch 2/2" in report and "Fork-Part: hardening" in report
    assert "re-target this hardening" in report
    assert "vllm/rope.py: content" in report


def test_conflict_then_continue(fork: Fork, tmp_path: Path) -> None:
    fork.write_series(V1, CONFLICT_SERIES)
    tree = tmp_path / "tree"
    materialize(fork.config, V1, tree)

    with pytest.raises(RebaseConflict) as info:
        start_rebase(fork.config, V1, V2, tree, log=quiet)
    report = str(info.value)
    assert "patch 3/6" in report and ROPE.subject in report
    assert "vllm/rope.py: content, 1 hunk(s)" in report
    assert "| rope line 10 upstream version" in report
    assert "| rope line 10 fork version" in report
    text = (tree / "vllm/rope.py").read_text().splitlines()
    start = text.index(next(ln for ln in text if ln.startswith("<<<<<<<"))) + 1
    end = text.index(next(ln for ln in text if ln.startswith(">>>>>>>"))) + 1
    assert f"lines {start}-{end}:" in report
    state = json.loads((tree / ".git" / STATE_FILE).read_text())
    assert state["phase"] == "conflict" and state["next"] == 2

    # Not resolved yet: refused, nothing changes.
    with pytest.raises(WorkTreeError, match="still have conflicts"):
        continue_rebase(fork.config, tree, log=quiet)
    # Resolved in the file but not staged: refused.
    resolve(tree / "vllm/rope.py", KEEP_FORK)
    with pytest.raises(WorkTreeError, match="still have conflicts"):
        continue_rebase(fork.config, tree, log=quiet)
    git(tree, "add", "vllm/rope.py")
    (tree / "stray.txt").write_text("not part of the resolution\n")
    with pytest.raises(WorkTreeError, match="not staged"):
        continue_rebase(fork.config, tree, log=quiet)
    (tree / "stray.txt").unlink()

    result = continue_rebase(fork.config, tree, log=quiet)
    assert [p.result for p in result.state.picks] == [
        "applied",
        "applied",
        "applied",
        "applied",
        "absorbed",
        "applied",
    ]
    assert result.state.picks[2].detail == "3-way merge, conflict resolved by hand"
    assert "rope line 10 fork version" in (tree / "vllm/rope.py").read_text()
    assert git(tree, "status", "--porcelain") == ""
    assert git(tree, "symbolic-ref", "HEAD") == "refs/heads/fork"
    assert len(load_series(fork.series_dir(V2)).patches) == 5
    # The resolved pick keeps the patch's author date and message.
    log = git(tree, "log", "--format=%s|%aI|%cI", "upstream/1.1.0..HEAD")
    for line in log.splitlines():
        _, authored, committed = line.split("|")
        assert authored == committed == "2026-11-21T12:00:00+00:00"


def test_conflict_resolved_with_a_commit(fork: Fork, tmp_path: Path) -> None:
    fork.write_series(V1, CONFLICT_SERIES)
    tree = tmp_path / "tree"
    materialize(fork.config, V1, tree)
    with pytest.raises(RebaseConflict):
        start_rebase(fork.config, V1, V2, tree, log=quiet)
    resolve(tree / "vllm/rope.py", KEEP_FORK)
    git(tree, "add", "vllm/rope.py")
    git(tree, "commit", "-q", "-C", result_commit(tree, fork))
    result = continue_rebase(fork.config, tree, log=quiet)
    assert result.state.picks[2].result == "applied"
    assert "rope line 10 fork version" in (tree / "vllm/rope.py").read_text()
    committer = git(tree, "log", "-1", "--format=%cn|%cI|%aI", "HEAD~2")
    name, committed, authored = committer.split("|")
    assert committed == authored


def test_git_rebase_continue_run_by_hand(fork: Fork, tmp_path: Path) -> None:
    # git rebase does the replay: a user who runs `git rebase --continue` after
    # resolving is where `vllm-fork rebase --continue` would have taken them.
    fork.write_series(V1, CONFLICT_SERIES)
    tree = tmp_path / "tree"
    materialize(fork.config, V1, tree)
    with pytest.raises(RebaseConflict):
        start_rebase(fork.config, V1, V2, tree, log=quiet)
    resolve(tree / "vllm/rope.py", KEEP_FORK)
    git(tree, "add", "vllm/rope.py")
    git(tree, "-c", "core.editor=true", "rebase", "--continue")
    result = continue_rebase(fork.config, tree, log=quiet)
    assert [p.result for p in result.state.picks] == ["applied"] * 4 + ["absorbed", "applied"]
    assert result.state.picks[2].detail == "conflict resolved by hand (1 commit(s))"
    assert "rope line 10 fork version" in (tree / "vllm/rope.py").read_text()
    assert len(git(tree, "log", "--format=%H", "upstream/1.1.0..HEAD").split()) == 5


def result_commit(tree: Path, fork: Fork) -> str:
    state = json.loads((tree / ".git" / STATE_FILE).read_text())
    return state["picks"][state["next"]]["commit"]


def test_conflict_then_abort_restores_everything(fork: Fork, tmp_path: Path) -> None:
    fork.write_series(V1, CONFLICT_SERIES)
    tree = tmp_path / "tree"
    materialize(fork.config, V1, tree)
    # A tag upstream/V2 from an earlier attempt must come back too.
    git(tree, "tag", "upstream/1.1.0", "HEAD~2")
    before = snapshot(tree)
    series_before = series_files(fork.series_dir(V1))

    with pytest.raises(RebaseConflict):
        start_rebase(fork.config, V1, V2, tree, log=quiet)
    assert snapshot(tree) != before
    abort_rebase(fork.config, tree, log=quiet)

    assert snapshot(tree) == before
    assert not (tree / ".git" / STATE_FILE).exists()
    assert not (tree / ".git" / "MERGE_MSG").exists()
    assert series_files(fork.series_dir(V1)) == series_before
    assert not fork.series_dir(V2).exists()
    with pytest.raises(WorkTreeError, match="no vllm-fork rebase is in progress"):
        abort_rebase(fork.config, tree, log=quiet)


def test_dirty_tree_is_refused(fork: Fork, tmp_path: Path) -> None:
    fork.write_series(V1, CLEAN_SERIES)
    tree = tmp_path / "tree"
    materialize(fork.config, V1, tree)
    (tree / "vllm/ops.py").write_text("local edit\n")
    before = snapshot(tree)
    with pytest.raises(WorkTreeError, match="uncommitted changes"):
        start_rebase(fork.config, V1, V2, tree, log=quiet)
    assert snapshot(tree) == before
    assert not (tree / ".git" / STATE_FILE).exists()
    git(tree, "checkout", "vllm/ops.py")
    (tree / "notes.txt").write_text("untracked\n")
    with pytest.raises(WorkTreeError, match="notes.txt"):
        start_rebase(fork.config, V1, V2, tree, log=quiet)
    assert (tree / "notes.txt").read_text() == "untracked\n"


def test_bad_input_is_refused(fork: Fork, tmp_path: Path) -> None:
    fork.write_series(V1, CLEAN_SERIES)
    tree = tmp_path / "tree"
    materialize(fork.config, V1, tree)
    before = snapshot(tree)
    with pytest.raises(UnknownVersionError, match="vllm-fork pin 1.2.0"):
        start_rebase(fork.config, V1, "1.2.0", tree, log=quiet)
    with pytest.raises(WorkTreeError, match="work tree of 1.0.0, not 1.1.0"):
        start_rebase(fork.config, V2, V1, tree, force_series=True, log=quiet)
    fork.series_dir(V2).mkdir()
    (fork.series_dir(V2) / "series").write_text("")
    with pytest.raises(WorkTreeError, match="--force-series"):
        start_rebase(fork.config, V1, V2, tree, log=quiet)
    assert snapshot(tree) == before


def test_materializes_into_a_new_directory(fork: Fork, tmp_path: Path) -> None:
    fork.write_series(V1, CLEAN_SERIES)
    tree = tmp_path / "new"
    result = start_rebase(fork.config, V1, V2, tree, log=quiet)
    assert [p.result for p in result.state.picks].count("applied") == 4
    assert git(tree, "config", "vllm-fork.base") == V2


class Crash(BaseException):
    """Stands for the process dying: nothing after it runs, no handler sees it."""


def crash_after(monkeypatch: pytest.MonkeyPatch, name: str):
    """Make the rebase engine's ``name`` run, then the process die; return the real one."""
    real = getattr(rebase_mod, name)

    def crashing(*args, **kwargs):
        real(*args, **kwargs)
        raise Crash()

    monkeypatch.setattr(rebase_mod, name, crashing)
    return real


def test_crash_during_picks_can_continue(
    fork: Fork, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fork.write_series(V1, CLEAN_SERIES)
    reference = tmp_path / "reference"
    materialize(fork.config, V1, reference)
    start_rebase(fork.config, V1, V2, reference, force_series=True, log=quiet)
    expected = git(reference, "rev-parse", "HEAD")

    real_normalize = rebase_mod._normalize
    calls = {"n": 0}

    def crashing_normalize(tree_path: Path, base: str) -> str:
        calls["n"] += 1
        if calls["n"] == 2:  # git made the commit, the state file does not say so yet
            raise Crash()
        return real_normalize(tree_path, base)

    tree = tmp_path / "tree"
    materialize(fork.config, V1, tree)
    monkeypatch.setattr(rebase_mod, "_normalize", crashing_normalize)
    with pytest.raises(Crash):
        start_rebase(fork.config, V1, V2, tree, force_series=True, log=quiet)
    monkeypatch.setattr(rebase_mod, "_normalize", real_normalize)
    state = json.loads((tree / ".git" / STATE_FILE).read_text())
    assert state["phase"] == "picking" and state["next"] == 1

    result = continue_rebase(fork.config, tree, log=quiet)
    assert git(tree, "rev-parse", "HEAD") == expected
    assert [p.result for p in result.state.picks] == ["applied"] * 3 + ["absorbed", "applied"]


def test_crash_mid_pick_leaves_work_tree_recoverable(
    fork: Fork, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fork.write_series(V1, CLEAN_SERIES)

    real_record = rebase_mod._record

    def half_pick(tree_path: Path, git_dir: Path, *args, **kwargs) -> None:
        # git was stopped inside the next pick: its line is done, index and files dirty.
        todo = git_dir / "rebase-merge" / "git-rebase-todo"
        lines = todo.read_text().splitlines()
        first = next(i for i, line in enumerate(lines) if line.startswith("pick "))
        with open(git_dir / "rebase-merge" / "done", "a") as done:
            done.write(lines[first] + "\n")
        todo.write_text("\n".join(lines[first + 1 :]) + "\n")
        git(tree_path, "cherry-pick", "--no-commit", lines[first].split()[1])
        raise Crash()

    tree = tmp_path / "tree"
    materialize(fork.config, V1, tree)
    monkeypatch.setattr(rebase_mod, "_record", half_pick)
    with pytest.raises(Crash):
        start_rebase(fork.config, V1, V2, tree, log=quiet)
    monkeypatch.setattr(rebase_mod, "_record", real_record)
    assert git(tree, "status", "--porcelain") != ""
    result = continue_rebase(fork.config, tree, log=quiet)
    assert [p.result for p in result.state.picks].count("applied") == 4


def test_crash_during_import_then_abort(
    fork: Fork, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fork.write_series(V1, CLEAN_SERIES)
    tree = tmp_path / "tree"
    materialize(fork.config, V1, tree)
    before = snapshot(tree)
    real_stack = crash_after(monkeypatch, "stack_upstream")
    with pytest.raises(Crash):
        start_rebase(fork.config, V1, V2, tree, log=quiet)
    monkeypatch.setattr(rebase_mod, "stack_upstream", real_stack)
    # A second start is refused while the state file is there.
    with pytest.raises(WorkTreeError, match="--continue"):
        start_rebase(fork.config, V1, V2, tree, log=quiet)
    abort_rebase(fork.config, tree, log=quiet)
    assert snapshot(tree) == before


def test_crash_while_finishing_then_abort(
    fork: Fork, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fork.write_series(V1, CLEAN_SERIES)
    series_before = series_files(fork.series_dir(V1))
    tree = tmp_path / "tree"
    materialize(fork.config, V1, tree)
    before = snapshot(tree)
    crash_after(monkeypatch, "export")
    with pytest.raises(Crash):
        start_rebase(fork.config, V1, V2, tree, log=quiet)
    assert fork.series_dir(V2).is_dir()
    abort_rebase(fork.config, tree, log=quiet)
    assert snapshot(tree) == before
    assert series_files(fork.series_dir(V1)) == series_before
    assert not fork.series_dir(V2).exists()


def test_state_file_is_replaced_atomically(
    fork: Fork, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fork.write_series(V1, CONFLICT_SERIES)
    tree = tmp_path / "tree"
    materialize(fork.config, V1, tree)
    with pytest.raises(RebaseConflict):
        start_rebase(fork.config, V1, V2, tree, log=quiet)
    path = tree / ".git" / STATE_FILE
    good = path.read_text()

    def failing_replace(*_args, **_kwargs):
        raise Crash()

    monkeypatch.setattr("vllm_fork.atomic.os.replace", failing_replace)
    resolve(tree / "vllm/rope.py", KEEP_FORK)
    git(tree, "add", "vllm/rope.py")
    with pytest.raises(Crash):
        continue_rebase(fork.config, tree, log=quiet)
    monkeypatch.undo()
    assert path.read_text() == good  # the old state, whole
    # The pick was committed before the state could say so: --continue sees it done.
    result = continue_rebase(fork.config, tree, log=quiet)
    assert [p.result for p in result.state.picks][2] == "applied"


def test_cli_conflict_continue_and_summary(
    fork: Fork, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fork.write_series(V1, CONFLICT_SERIES)
    tree = tmp_path / "tree"
    assert main(["rebase", "--from", V1, "--onto", V2, str(tree)]) == 1
    out = capsys.readouterr().out
    assert "CONFLICT replaying patch 3/6" in out
    # the commands that go on name the work tree
    for action in ("--continue", "--skip --reason TEXT", "--abort"):
        assert f"`vllm-fork rebase {action} {tree}`" in out
    assert main(["rebase", "--from", V1, "--onto", V2, str(tree)]) != 0
    assert "in progress" in capsys.readouterr().err
    resolve(tree / "vllm/rope.py", KEEP_UPSTREAM)
    git(tree, "add", "vllm/rope.py")
    # Upstream's side only: an empty resolution is not taken silently ...
    assert main(["rebase", "--continue", str(tree)]) == 1
    assert "vllm-fork rebase --skip" in capsys.readouterr().err
    # ... but dropped on request, with the reason the review records.
    assert main(["rebase", "--skip", "--reason", "upstream's version is kept", str(tree)]) == 0
    out = capsys.readouterr().out
    assert "dropped by hand (--skip)" in out
    assert "0005-ROCm-Precast-the-bias-once.patch" in out
    table = out[out.index("patch ") :]
    assert "moe-bias-precast  change     absorbed" in table
    assert main(["rebase", "--abort", str(tree)]) != 0
    assert main(["rebase", "--skip", str(tree)]) != 0
    assert main(["rebase", str(tree)]) == 2
    assert main(["rebase", "--continue", "--from", V1, str(tree)]) == 2


def test_patch_to_a_file_upstream_deleted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    without_other = {k: v for k, v in V1_FILES.items() if k != "vllm/other.py"}
    fork = make_fork(tmp_path, monkeypatch, {V1: V1_FILES, "1.2.0": without_other}, default=V1)
    fork.write_series(V1, [OTHER, MOE])
    tree = tmp_path / "tree"
    materialize(fork.config, V1, tree)
    with pytest.raises(RebaseConflict) as info:
        start_rebase(fork.config, V1, "1.2.0", tree, log=quiet)
    assert "vllm/other.py: changed by the patch, deleted or moved upstream" in str(info.value)
    git(tree, "rm", "-q", "vllm/other.py")
    with pytest.raises(WorkTreeError, match="--skip"):
        continue_rebase(fork.config, tree, log=quiet)
    result = continue_rebase(fork.config, tree, skip=True, log=quiet)
    assert [(p.result, p.detail) for p in result.state.picks] == [
        ("absorbed", "dropped by hand (--skip)"),
        ("applied", "clean"),
    ]
    assert not (tree / "vllm/other.py").exists()
    # Dropping it was the user's call: the review says so; no series file records it.
    (name,) = [n for n in series_files(fork.series_dir(V1)) if "Touch-other" in n]
    assert parse_patch(stored_patch(fork.series_dir(V1), name)).applied_upstream is None
    assert store.read_base(fork.config.series_root, "1.2.0").comments == []
    review = json.loads((tree / ".git/vllm-fork/review.json").read_text())
    assert (review["patches"][0]["patch"], review["patches"][0]["outcome"]) == (name, "dropped")
    with pytest.raises(WorkTreeError, match="no vllm-fork rebase is in progress"):
        continue_rebase(fork.config, tree, skip=True, log=quiet)


def test_file_added_by_an_absorbed_patch_is_named_in_the_conflict(
    fork: Fork, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The change patch brings its own test module; the hardening extends it.
    # Upstream absorbs the change without that module: the report must not
    # send the user looking for where upstream moved it.
    change = PatchSpec(
        "[ROCm] Change rope and test it",
        "dsv32-decode",
        "change",
        {
            "vllm/rope.py": {10: "rope line 10 fork version"},
            "tests/test_rope.py": {1: "t 1", 3: "t 3"},
        },
    )
    hardening = PatchSpec(
        "[ROCm] Harden rope, test it too",
        "dsv32-decode",
        "hardening",
        {"vllm/rope.py": {20: "rope line 20 hardened"}, "tests/test_rope.py": {2: "t 2"}},
    )
    fork.write_series(V1, [change, hardening])
    tree = tmp_path / "tree"
    materialize(fork.config, V1, tree)
    monkeypatch.setattr(
        "vllm_fork.rebase.engine.probe_upstream",
        lambda *_: {"dsv32-decode": ("present", "found upstream")},
    )
    with pytest.raises(RebaseConflict) as info:
        start_rebase(fork.config, V1, V2, tree, log=quiet)
    report = str(info.value)
    assert "deleted or moved upstream" not in report
    assert (
        "tests/test_rope.py: changed by the patch; added by the dropped patch "
        "'[ROCm] Change rope and test it', not in upstream 1.1.0" in report
    )
    # The state keeps the explanation for a later look at the conflict.
    git(tree, "add", "tests/test_rope.py")
    result = continue_rebase(fork.config, tree, log=quiet)
    assert results(result.state) == [
        (change.subject, "absorbed"),
        (hardening.subject, "applied"),
    ]
    assert (tree / "tests/test_rope.py").read_text().splitlines()[:2] == ["t 1", "t 2"]


def test_added_file_stays_in_a_directory_upstream_emptied(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Upstream moves every file of tests/old/ to tests/new/; the fork adds its
    # own test module to tests/old/. Git's directory rename detection would
    # move it to tests/new/ (and stop on it); the fork's file stays put.
    old = {"tests/old/test_a.py": "a\n" * 20, "tests/old/test_b.py": "b\n" * 20}
    new = {k.replace("/old/", "/new/"): v for k, v in old.items()}
    fork = make_fork(
        tmp_path, monkeypatch, {V1: {**V1_FILES, **old}, V2: {**V1_FILES, **new}}, default=V1
    )
    added = PatchSpec(
        "[ROCm][Tests] Add a fork test", "rocm-sim", "support", {"tests/old/test_fork.py": {2: "x"}}
    )
    fork.write_series(V1, [added])
    tree = tmp_path / "tree"
    materialize(fork.config, V1, tree)
    result = start_rebase(fork.config, V1, V2, tree, log=quiet)
    assert results(result.state) == [(added.subject, "applied")]
    assert (tree / "tests/old/test_fork.py").is_file()
    assert not (tree / "tests/new/test_fork.py").exists()


def _other_checkout(fork: Fork, tmp_path: Path) -> Path:
    """A second fork repository with the same pins: the checkout the tool is
    installed from, which the tool fell back to outside any repository."""
    other = tmp_path / "installed-checkout"
    (other / "series").mkdir(parents=True)
    (other / "bases.toml").write_bytes((fork.root / "bases.toml").read_bytes())
    return other


def test_continue_from_inside_the_tree_writes_the_starting_repository(
    fork: Fork, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`rebase --continue DIR` run from inside the work tree, outside any fork
    repository: the series go to the repository the rebase started from (its
    state records it), not to the checkout the tool is installed from."""
    fork.write_series(V1, CONFLICT_SERIES)
    tree = tmp_path / "tree"
    assert main(["rebase", "--from", V1, "--onto", V2, str(tree)]) == 1
    resolve(tree / "vllm/rope.py", KEEP_FORK)
    git(tree, "add", "vllm/rope.py")
    capsys.readouterr()
    other = _other_checkout(fork, tmp_path)
    monkeypatch.delenv("VLLM_FORK_ROOT")
    monkeypatch.setattr("vllm_fork.sources.workspace.find_root", lambda start=None: other)
    monkeypatch.chdir(tree)
    assert main(["rebase", "--continue", "."]) == 0
    out = capsys.readouterr().out
    assert not (other / "series" / V2).exists()
    assert len(load_series(fork.series_dir(V2)).patches) == 5
    assert f"{fork.series_dir(V2).resolve()}: " in out


def test_continue_from_another_repository_is_refused(
    fork: Fork, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fork.write_series(V1, CONFLICT_SERIES)
    tree = tmp_path / "tree"
    assert main(["rebase", "--from", V1, "--onto", V2, str(tree)]) == 1
    resolve(tree / "vllm/rope.py", KEEP_FORK)
    git(tree, "add", "vllm/rope.py")
    capsys.readouterr()
    other = _other_checkout(fork, tmp_path)
    monkeypatch.setenv("VLLM_FORK_ROOT", str(other))
    before = snapshot(tree)
    assert main(["rebase", "--continue", str(tree)]) == 2
    err = capsys.readouterr().err
    assert f"started from the fork repository {fork.root.resolve()}" in err
    assert snapshot(tree) == before
    assert not (other / "series" / V2).exists() and not fork.series_dir(V2).exists()
    monkeypatch.setenv("VLLM_FORK_ROOT", str(fork.root))
    assert main(["rebase", "--continue", str(tree)]) == 0


def test_export_writes_the_repository_the_tree_was_made_from(
    fork: Fork, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fork.write_series(V1, CLEAN_SERIES)
    tree = tmp_path / "tree"
    materialize(fork.config, V1, tree)
    shutil.rmtree(fork.series_dir(V1))
    other = _other_checkout(fork, tmp_path)
    monkeypatch.setenv("VLLM_FORK_ROOT", str(other))
    assert main(["export", str(tree)]) == 2
    assert "run it from" in capsys.readouterr().err
    assert not (other / "series" / V1).exists()
    monkeypatch.delenv("VLLM_FORK_ROOT")
    monkeypatch.setattr("vllm_fork.sources.workspace.find_root", lambda start=None: other)
    monkeypatch.chdir(tree)
    assert main(["export", "."]) == 0
    assert capsys.readouterr().out.startswith(f"{fork.series_dir(V1).resolve()}: ")
    assert not (other / "series" / V1).exists()
    assert len(load_series(fork.series_dir(V1)).patches) == len(CLEAN_SERIES)


def test_rebase_without_dir_outside_a_work_tree_is_refused(
    fork: Fork, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """DIR defaults to the current directory; in the fork repository itself
    that is no work tree: refused (exit 2) with what to give instead."""
    fork.write_series(V1, CLEAN_SERIES)
    git(fork.root, "init", "-q")
    monkeypatch.chdir(fork.root)
    assert main(["rebase", "--from", V1, "--onto", V2]) == 2
    err = capsys.readouterr().err
    assert "is not a work tree made by `vllm-fork materialize`" in err
    assert "give the work tree as DIR" in err
    assert main(["rebase", "--continue"]) == 2


def _store_bytes(fork: Fork) -> dict[str, bytes]:
    root = fork.config.series_root
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_rebase_of_a_stored_once_series(
    fork: Fork, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rebase writes V2 into the store and leaves V1's series as it was
    (history goes to the review), and an abort after a crash while finishing puts
    the store back byte for byte."""
    fork.write_series(V1, CLEAN_SERIES)
    root = fork.config.series_root
    before = _store_bytes(fork)
    v1_before = store.read_base(root, V1)
    tree = tmp_path / "tree"
    materialize(fork.config, V1, tree)
    real_export = crash_after(monkeypatch, "export")
    with pytest.raises(Crash):
        start_rebase(fork.config, V1, V2, tree, log=quiet)
    assert _store_bytes(fork) != before
    abort_rebase(fork.config, tree, log=quiet)
    assert _store_bytes(fork) == before

    monkeypatch.setattr(rebase_mod, "export", real_export)
    shutil.rmtree(tree)
    materialize(fork.config, V1, tree)
    start_rebase(fork.config, V1, V2, tree, log=quiet)
    assert store.read_base(root, V2) is not None
    v1 = store.read_base(root, V1)
    assert v1.names == v1_before.names and v1.contents == v1_before.contents
    pool = {k: v for k, v in _store_bytes(fork).items() if k.startswith("pool/")}
    assert len(set(pool.values())) == len(pool)
