"""`vllm-fork test`: fork tests run in a work tree and are proven to fail
without the patch that brings them."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from vllm_fork.git import run_git
from vllm_fork.testing.forktests import (
    is_test_module,
    parse_junit,
    patch_commits,
    prove_failing,
    run_fork_tests,
)
from vllm_fork.tree.materialize import BASE_KEY

HEADER = """{subject}

Body.

Fork-Change: {change}
Fork-Part: {part}
Origin: vendor
Forwarded: no
"""


def _commit(tree: Path, files: dict[str, str], subject: str, change: str, part: str) -> None:
    for rel, text in files.items():
        path = tree / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    run_git(["add", "-A"], cwd=tree)
    message = HEADER.format(subject=subject, change=change, part=part)
    run_git(["commit", "-q", "-m", message], cwd=tree)


@pytest.fixture
def work_tree(tmp_path: Path) -> Path:
    """A tiny 'upstream' with a series of four patches, like materialize makes."""
    tree = tmp_path / "tree"
    tree.mkdir()
    run_git(["init", "-q", "-b", "fork"], cwd=tree)
    run_git(["config", "user.name", "t"], cwd=tree)
    run_git(["config", "user.email", "t@example.invalid"], cwd=tree)
    run_git(["config", BASE_KEY, "9.9.9"], cwd=tree)
    (tree / "pkg").mkdir()
    (tree / "pkg" / "__init__.py").write_text("")
    (tree / "pkg" / "gate.py").write_text("def gate(n):\n    return n in (512, 1024)\n")
    run_git(["add", "-A"], cwd=tree)
    run_git(["commit", "-q", "-m", "upstream"], cwd=tree)
    run_git(["tag", "upstream/9.9.9"], cwd=tree)
    _commit(
        tree,
        {
            "tests/sim/helper.py": "VALUE = 1\n",
            "tests/sim/test_sim.py": "def test_x():\n    pass\n",
        },
        "Add the simulation",
        "rocm-sim",
        "support",
    )
    _commit(
        tree,
        {
            "pkg/gate.py": "def gate(n):\n    return n % 8 == 0\n",
            "tests/test_gate.py": (
                "from pkg.gate import gate\n\n\ndef test_2880():\n    assert gate(2880)\n"
            ),
        },
        "Gate by pack size",
        "ar-rms-pack-gate",
        "change",
    )
    _commit(
        tree,
        {
            "tests/test_pinned.py": (
                "from pkg.gate import gate\n\n\ndef test_512():\n    assert gate(512)\n"
            )
        },
        "Pin upstream behaviour",
        "ar-rms-pack-gate",
        "tests",
    )
    _commit(
        tree,
        {"tests/test_weak.py": "def test_nothing_to_do_with_the_patch():\n    assert True\n"},
        "A hardening whose test does not depend on it",
        "ar-rms-pack-gate",
        "hardening",
    )
    return tree


def test_is_test_module() -> None:
    assert is_test_module("tests/rocm/aiter/test_gate.py")
    assert not is_test_module("tests/rocm/sim/helper.py")
    assert not is_test_module("vllm/test_utils.py")


def test_patch_commits_reads_trailers_and_test_files(work_tree: Path) -> None:
    commits = patch_commits(work_tree)
    assert [c.part for c in commits] == ["support", "change", "tests", "hardening"]
    assert commits[1].change == "ar-rms-pack-gate"
    assert commits[1].test_files == ("tests/test_gate.py",)
    assert commits[0].test_files == ("tests/sim/test_sim.py",)


def test_run_fork_tests_runs_every_series_test(work_tree: Path) -> None:
    outcome = run_fork_tests(work_tree, sys.executable)
    assert outcome.green
    assert outcome.tests == 4


def test_prove_failing_judges_change_and_hardening(work_tree: Path) -> None:
    proofs = {p.patch.subject: p for p in prove_failing(work_tree, sys.executable)}
    change = proofs["Gate by pack size"]
    assert change.without is not None and change.without.failed == 1
    assert change.ok and change.verdict == "fails without the patch"
    pinned = proofs["Pin upstream behaviour"]
    assert pinned.without is None and pinned.verdict == "pins upstream behaviour"
    weak = proofs["A hardening whose test does not depend on it"]
    assert not weak.ok and weak.verdict == "NOT PROVEN: passes without the patch"
    # the work tree is left as it was: no stray worktrees, nothing modified
    listed = run_git(["worktree", "list"], cwd=work_tree).stdout.decode().splitlines()
    assert len(listed) == 1
    assert run_git(["status", "--porcelain"], cwd=work_tree).stdout == b""


def test_parse_junit_missing_report_counts_as_error(tmp_path: Path) -> None:
    outcome = parse_junit(tmp_path / "absent.xml", returncode=4)
    assert outcome.red and not outcome.green


def test_cli_resolves_a_relative_interpreter_before_leaving_for_the_tree(
    work_tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vllm_fork.cli.main import main

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    relative = os.path.relpath(sys.executable, elsewhere)
    assert os.sep in relative
    # the series of work_tree holds one hardening patch whose test does not
    # depend on it, so plain `test` (without --prove-fail) must pass
    assert main(["test", str(work_tree), "--python", relative]) == 0
