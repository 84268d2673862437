"""`vllm-fork backport` on synthetic bases: clean, adapted by 3-way, conflict,
not applicable, already carried, failing checks, kill + resume, no half write.

Five fake releases share ``vllm/ops.py`` (or lack it); the fix edits its line
20 and adds a test that reads it, so the fork tests and the prove-fail of the
backported patch really run (pytest with this interpreter) on every base.
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_fork.backport import carry as bp
from vllm_fork.backport.checks import fork_checks
from vllm_fork.series import store
from vllm_fork.sources.workspace import load_config
from vllm_fork.tree.export import export
from vllm_fork.tree.materialize import materialize

try:
    from .rebase_support import DATE, OTHER, edit_lines, git, make_fork, numbered, resolve, text
    from .seriesutil import logical_files, patch_names, stored_patch, tree_files
except ImportError:
    from rebase_support import DATE, OTHER, edit_lines, git, make_fork, numbered, resolve, text
    from seriesutil import logical_files, patch_names, stored_patch, tree_files

OPS = numbered("ops", 40)
BASE_FILES = {"vllm/other.py": text(numbered("other", 20))}

RELEASES = {
    # the base the fix is written on
    "1.0.0": {**BASE_FILES, "vllm/ops.py": text(OPS)},
    # the same file: the diff applies as it is
    "1.1.0": {**BASE_FILES, "vllm/ops.py": text(OPS)},
    # a context line of the hunk changed upstream: only the 3-way merge fits it
    "1.2.0": {**BASE_FILES, "vllm/ops.py": text(OPS[:17] + ["ops line 18 upstream"] + OPS[18:])},
    # the very line the fix edits changed upstream: a conflict
    "1.3.0": {**BASE_FILES, "vllm/ops.py": text(OPS[:19] + ["ops line 20 upstream"] + OPS[20:])},
    # no ops.py: the known issue's probe says the code is absent
    "1.4.0": dict(BASE_FILES),
}

REGISTER = """\
[[issue]]
id = "fake-ops-line-20"
title = "ops line 20 is wrong"
tracker_refs = ["vllm#1"]
change = "ar-rms-pack-gate"
impact = "wrong ops"
decision = "fix"
reason = "a fork fix"
affected = { file = "vllm/ops.py", match = '^ops line 20' }
fixed = { file = "vllm/ops.py", match = '^ops line 20 fixed$' }
"""

FIX_TEST = """\
from pathlib import Path


def test_line_20_is_fixed():
    assert "ops line 20 fixed" in Path("vllm/ops.py").read_text().splitlines()
"""

VACUOUS_TEST = """\
def test_nothing_to_see():
    assert 1 + 1 == 2
"""

MESSAGE = (
    "[ROCm] Fix ops line 20\n\nWhat the fix does, for the tests.\n\n"
    "Fork-Change: ar-rms-pack-gate\nFork-Part: fix\nOrigin: vendor\nForwarded: no\n"
    "Fork-Fixes: fake-ops-line-20\nFork-Patch: ops-line-20\n"
)


@pytest.fixture
def fork(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    fork = make_fork(tmp_path, monkeypatch, RELEASES, default="1.0.0")
    (fork.root / "known-issues.toml").write_text(REGISTER)
    for version in RELEASES:
        fork.write_series(version, [OTHER])
    fork.config = load_config()
    return fork


def fix_commit(fork, tmp_path: Path, test: str = FIX_TEST) -> Path:
    tree = tmp_path / "work-1.0.0"
    materialize(fork.config, "1.0.0", tree)
    edit_lines(tree / "vllm/ops.py", {20: "ops line 20 fixed"})
    (tree / "tests").mkdir()
    (tree / "tests" / "test_ops_fix.py").write_text(test)
    git(tree, "add", "-A")
    git(tree, "commit", "-q", "-m", MESSAGE, env={"GIT_AUTHOR_DATE": DATE})
    return tree


def series_snapshot(root: Path) -> dict[str, bytes]:
    """series/ as per-base files ("V/0001-<stem>.patch", "V/series"), read through the store."""
    return logical_files(root)


def checks() -> bp.CheckRunner:
    return fork_checks(lambda tree: sys.executable)


def run(fork, tree: Path, bases: list[str] | None = None, **kw) -> bp.Report:
    config = load_config()
    source, state_dir = bp.source_from_tree(config, tree)
    targets = bp.select_targets(config, bases)
    return bp.backport(config, source, state_dir, targets, checks(), jobs=2, **kw)


def verdicts(report: bp.Report) -> dict[str, str]:
    return {r.version: r.verdict for r in report.results}


def test_every_verdict_and_no_half_write(fork, tmp_path: Path) -> None:
    tree = fix_commit(fork, tmp_path)
    before = series_snapshot(fork.root / "series")

    report = run(fork, tree)

    assert verdicts(report) == {
        "1.0.0": bp.CLEAN,
        "1.1.0": bp.CLEAN,
        "1.2.0": bp.ADAPTED,
        "1.3.0": bp.CONFLICT,
        "1.4.0": bp.NOT_APPLICABLE,
    }
    results = {r.version: r for r in report.results}
    assert results["1.3.0"].files == ["vllm/ops.py"]
    assert "not affected (no vllm/ops.py)" in results["1.4.0"].reason
    for version in ("1.0.0", "1.1.0", "1.2.0"):
        assert results[version].proof == "fails without the patch"
        assert results[version].tests.startswith("1 passed, 0 failed")
    # one base conflicts: no series is written
    assert not report.ok and report.written == []
    assert series_snapshot(fork.root / "series") == before
    text_ = bp.format_report(report)
    assert "series/ left untouched: 1.3.0" in text_
    assert "cherry-pick --continue" in text_ and "vllm-fork export backport-1.3.0" in text_

    # the same command without the conflicting base: the others are taken from
    # the first run, and every series is written at once
    report = run(fork, tree, ["1.0.0", "1.1.0", "1.2.0", "1.4.0"])
    assert sorted(report.reused) == ["1.0.0", "1.1.0", "1.2.0", "1.4.0"]
    assert report.ok
    after = series_snapshot(fork.root / "series")
    added = sorted(set(after) - set(before))
    assert added == [f"{v}/0002-ROCm-Fix-ops-line-20.patch" for v in ("1.0.0", "1.1.0", "1.2.0")]
    for version in ("1.0.0", "1.1.0", "1.2.0"):
        assert patch_names(fork.root / "series" / version)[-1] == "0002-ROCm-Fix-ops-line-20.patch"
    assert after["1.4.0/series"] == before["1.4.0/series"]
    assert after["1.3.0/series"] == before["1.3.0/series"]
    # the exported patch materializes, and the fixed line is there
    out = tmp_path / "check-1.2.0"
    materialize(load_config(), "1.2.0", out)
    assert "ops line 20 fixed" in (out / "vllm/ops.py").read_text()
    assert "ops line 18 upstream" in (out / "vllm/ops.py").read_text()

    # once carried, a new run finds it everywhere and writes nothing
    report = run(fork, tree, ["1.0.0", "1.1.0"])
    assert verdicts(report) == {"1.0.0": bp.CARRIED, "1.1.0": bp.CARRIED}
    assert report.written == []


def test_a_patch_whose_test_does_not_fail_without_it_is_not_carried(fork, tmp_path: Path) -> None:
    tree = fix_commit(fork, tmp_path, test=VACUOUS_TEST)
    before = series_snapshot(fork.root / "series")
    report = run(fork, tree, ["1.0.0", "1.1.0"])
    assert verdicts(report) == {"1.0.0": bp.FAILED, "1.1.0": bp.FAILED}
    assert all("not proven" in r.proof.lower() or "pass" in r.proof for r in report.results)
    assert series_snapshot(fork.root / "series") == before


def test_carry_a_patch_by_its_id(fork, tmp_path: Path) -> None:
    tree = fix_commit(fork, tmp_path)
    assert run(fork, tree, ["1.0.0"]).ok  # series/1.0.0 now carries it
    config = load_config()
    source, state_dir = bp.source_from_patch(config, "ops-line-20", ["1.0.0", "1.1.0"], None)
    assert source.version == "1.0.0" and source.identity == "ops-line-20"
    report = bp.backport(config, source, state_dir, ["1.0.0", "1.1.0"], checks(), jobs=1)
    assert verdicts(report) == {"1.0.0": bp.CARRIED, "1.1.0": bp.CLEAN}
    name = "0002-ROCm-Fix-ops-line-20.patch"
    assert stored_patch(fork.root / "series/1.1.0", name) == stored_patch(
        fork.root / "series/1.0.0", name
    )


def _killed_run(fault: str, bases: list[str], tree: Path) -> int:
    """Run the backport in a child process that the fault point kills."""

    def child() -> None:
        os.environ["VLLM_FORK_FAULT"] = fault
        config = load_config()
        source, state_dir = bp.source_from_tree(config, tree)
        bp.backport(config, source, state_dir, bases, checks(), jobs=1)
        os._exit(0)

    proc = multiprocessing.get_context("fork").Process(target=child)
    proc.start()
    proc.join(300)
    return proc.exitcode


@pytest.mark.parametrize("fault", ["backport.base:kill", "backport.commit:kill"])
def test_kill_and_resume(fork, tmp_path: Path, fault: str) -> None:
    tree = fix_commit(fork, tmp_path)
    bases = ["1.0.0", "1.1.0"]
    before = tree_files(fork.root / "series")

    assert _killed_run(fault, bases, tree) == -9
    now = tree_files(fork.root / "series")
    if fault == "backport.base:kill":
        assert now == before  # killed before the write: series/ untouched
    else:
        assert now != before  # killed while writing: the next run finishes the write

    report = run(fork, tree, bases)
    assert report.ok and report.reused
    after = series_snapshot(fork.root / "series")
    for version in bases:
        assert f"{version}/0002-ROCm-Fix-ops-line-20.patch" in after
    assert not list((fork.root / "series").rglob(".*.backport"))


def test_a_conflict_resolved_by_hand_then_the_same_command(fork, tmp_path: Path) -> None:
    tree = fix_commit(fork, tmp_path)
    bases = ["1.1.0", "1.3.0"]
    before = series_snapshot(fork.root / "series")
    report = run(fork, tree, bases)
    assert verdicts(report) == {"1.1.0": bp.CLEAN, "1.3.0": bp.CONFLICT}
    assert series_snapshot(fork.root / "series") == before

    # what the report says to do, by hand
    (conflict,) = [r for r in report.results if r.verdict == bp.CONFLICT]
    commands = bp.resolve_commands(report, conflict)
    assert commands[0] == "vllm-fork materialize --base 1.3.0 backport-1.3.0"
    work = tmp_path / "backport-1.3.0"
    materialize(load_config(), "1.3.0", work)
    git(work, "fetch", "-q", str(report.state_dir / "source.git"), bp.SOURCE_REF)
    proc = subprocess.run(["git", "cherry-pick", "FETCH_HEAD"], cwd=work, capture_output=True)
    assert proc.returncode != 0  # it stops at the conflict
    resolve(work / "vllm/ops.py", ("ops line 20 upstream",))
    git(work, "add", "vllm/ops.py")
    git(work, "-c", "core.editor=true", "cherry-pick", "--continue")
    export(load_config(), work)

    # the same command: 1.3.0 now carries it and gets the fork tests and the
    # prove-fail of the others, in the same table; 1.1.0 comes from the first run
    report = run(fork, tree, bases)
    assert verdicts(report) == {"1.1.0": bp.CLEAN, "1.3.0": bp.RESOLVED}
    assert report.reused == ["1.1.0"] and report.ok
    (resolved,) = [r for r in report.results if r.version == "1.3.0"]
    assert resolved.tests.startswith("1 passed, 0 failed")
    assert resolved.proof == "fails without the patch"
    row = next(ln for ln in bp.format_report(report).splitlines() if ln.startswith("1.3.0"))
    assert "resolved by hand" in row and "fails without the patch" in row
    assert (
        store.read_base(fork.root / "series", "1.1.0").names[-1]
        == "0002-ROCm-Fix-ops-line-20.patch"
    )


def test_a_base_finished_by_hand_wrongly_fails_its_checks(fork, tmp_path: Path) -> None:
    """A hand resolution that keeps upstream's line (the fix lost) is checked like
    an applied base: its test fails, the base fails, and no other series is written."""
    tree = fix_commit(fork, tmp_path)
    bases = ["1.1.0", "1.3.0"]
    report = run(fork, tree, bases)
    assert verdicts(report) == {"1.1.0": bp.CLEAN, "1.3.0": bp.CONFLICT}
    work = tmp_path / "backport-1.3.0"
    materialize(load_config(), "1.3.0", work)
    git(work, "fetch", "-q", str(report.state_dir / "source.git"), bp.SOURCE_REF)
    subprocess.run(["git", "cherry-pick", "FETCH_HEAD"], cwd=work, capture_output=True)
    resolve(work / "vllm/ops.py", ("ops line 20 fixed",))  # the wrong side kept
    git(work, "add", "vllm/ops.py")
    git(work, "-c", "core.editor=true", "cherry-pick", "--continue")
    export(load_config(), work)
    before = series_snapshot(fork.root / "series")

    report = run(fork, tree, bases)
    assert verdicts(report) == {"1.1.0": bp.CLEAN, "1.3.0": bp.FAILED}
    (failed,) = [r for r in report.results if r.version == "1.3.0"]
    assert failed.reason == "resolved by hand, but the checks fail"
    assert "1 failed" in failed.tests and not report.ok
    assert series_snapshot(fork.root / "series") == before


def test_backport_into_the_store(fork, tmp_path: Path) -> None:
    """The carried patch lands in the store (a pool file and the base's series
    file), and a patch id is found on a base that is not among the targets."""
    root = fork.root / "series"
    assert bp.select_targets(load_config(), None) == list(RELEASES)
    tree = fix_commit(fork, tmp_path)
    pool_before = set((root / "pool").iterdir())
    report = run(fork, tree, ["1.0.0"])
    assert report.ok and verdicts(report) == {"1.0.0": bp.CLEAN}
    assert store.old_layout(root) == []
    assert store.read_base(root, "1.0.0").names[-1] == "0002-ROCm-Fix-ops-line-20.patch"
    (added,) = set((root / "pool").iterdir()) - pool_before
    assert added.name in (root / "1.0.0" / "series").read_text()

    config = load_config()
    holders = bp.select_targets(config, None)
    source, state_dir = bp.source_from_patch(config, "ops-line-20", holders, None)
    assert source.version == "1.0.0"
    report = bp.backport(config, source, state_dir, ["1.1.0"], checks(), jobs=1)
    assert verdicts(report) == {"1.1.0": bp.CLEAN} and report.ok
    carried = store.read_base(root, "1.1.0")
    assert carried.names[-1] == "0002-ROCm-Fix-ops-line-20.patch"
    assert carried.contents[-1] == store.read_base(root, "1.0.0").contents[-1]
    files = [p.read_bytes() for p in (root / "pool").iterdir()]
    assert len(set(files)) == len(files)  # still no patch stored twice
