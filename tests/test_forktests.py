"""`vllm-fork test`: fork tests run in a work tree and are proven to fail
without the patch that brings them."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from vllm_fork.config import ENV_ROOT
from vllm_fork.errors import ConfigError
from vllm_fork.git import run_git
from vllm_fork.testing.forktests import (
    NO_GPU_HERE,
    SIM_PLUGIN,
    format_proofs,
    is_test_module,
    parse_junit,
    patch_commits,
    prove_failing,
    prove_jobs,
    run_fork_tests,
    sim_plugin_args,
)
from vllm_fork.tree.materialize import BASE_KEY

HEADER = """{subject}

Body.

Fork-Change: {change}
Fork-Part: {part}
Origin: vendor
Forwarded: no
"""


def _commit(
    tree: Path, files: dict[str, str], subject: str, change: str, part: str, extra: str = ""
) -> None:
    for rel, text in files.items():
        path = tree / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    run_git(["add", "-A"], cwd=tree)
    message = HEADER.format(subject=subject, change=change, part=part) + extra
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


def test_a_tree_under_another_pytest_configuration_is_judged_the_same(
    work_tree: Path,
) -> None:
    """A tree inside a directory whose pyproject.toml configures pytest (a cache
    kept in a fork checkout, as the GitLab jobs keep theirs): pytest would take
    that directory as its rootdir and name the tests from there."""
    (work_tree.parent / "pyproject.toml").write_text(
        '[tool.pytest.ini_options]\ntestpaths = ["tests"]\n'
    )
    proofs = {p.patch.subject: p for p in prove_failing(work_tree, sys.executable)}
    change = proofs["Gate by pack size"]
    assert change.with_ is not None and change.with_.passed == 1
    assert change.ok and change.verdict == "fails without the patch"


def test_prove_failing_one_run_at_a_time_or_several_agrees(work_tree: Path) -> None:
    def verdicts(jobs: int) -> list[tuple[str, str]]:
        return [
            (p.patch.subject, p.verdict)
            for p in prove_failing(work_tree, sys.executable, jobs=jobs)
        ]

    serial = verdicts(1)
    assert serial == verdicts(3)
    assert ("Gate by pack size", "fails without the patch") in serial
    assert len(run_git(["worktree", "list"], cwd=work_tree).stdout.decode().splitlines()) == 1


@pytest.mark.parametrize("value", ["0", "-1", "two"])
def test_prove_jobs_rejects_a_bad_setting(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("VLLM_FORK_PROVE_JOBS", value)
    with pytest.raises(ConfigError, match="VLLM_FORK_PROVE_JOBS"):
        prove_jobs()


def test_prove_jobs_follows_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_FORK_PROVE_JOBS", "3")
    assert prove_jobs() == 3
    monkeypatch.delenv("VLLM_FORK_PROVE_JOBS")
    assert 1 <= prove_jobs() <= 4


def _proofs(tree: Path) -> dict:
    return {p.patch.subject: p for p in prove_failing(tree, sys.executable)}


def test_import_errors_without_the_patch_prove_nothing(work_tree: Path) -> None:
    # the test module imports what the patch adds: without the patch it cannot
    # be collected, which says nothing about the patch's behaviour
    _commit(
        work_tree,
        {
            "pkg/pack.py": "def pack(n):\n    return n // 8\n",
            "tests/test_pack.py": (
                "from pkg.pack import pack\n\n\ndef test_pack():\n    assert pack(16) == 2\n"
            ),
        },
        "Add a pack helper",
        "ar-rms-pack-gate",
        "change",
    )
    proof = _proofs(work_tree)["Add a pack helper"]
    assert proof.with_ is not None and proof.with_.green
    assert proof.without is not None and proof.without.errors >= 1
    assert proof.without.failed == 0
    assert not proof.ok
    assert proof.verdict == "NOT PROVEN: errors (not failures) without the patch"


def test_tests_erroring_with_the_patch_prove_nothing(work_tree: Path) -> None:
    # red both with and without the patch: an erroring tree is never proven
    _commit(
        work_tree,
        {
            "pkg/gate.py": "def gate(n):\n    return n % 16 == 0\n",
            "tests/test_broken.py": (
                "import a_module_nobody_has\n\n\ndef test_x():\n    assert False\n"
            ),
        },
        "A change whose tests cannot import",
        "ar-rms-pack-gate",
        "hardening",
    )
    proof = _proofs(work_tree)["A change whose tests cannot import"]
    assert proof.with_ is not None and proof.with_.errors >= 1
    assert not proof.ok
    assert proof.verdict == "NOT PROVEN: its tests do not pass with the patch"


def test_skips_without_the_patch_prove_nothing(work_tree: Path) -> None:
    _commit(
        work_tree,
        {
            "pkg/wide.py": "WIDTH = 64\n",
            "tests/test_wide.py": (
                "import pytest\n\n\ndef test_wide():\n"
                "    wide = pytest.importorskip('pkg.wide')\n    assert wide.WIDTH == 64\n"
            ),
        },
        "Add a width",
        "ar-rms-pack-gate",
        "change",
    )
    proof = _proofs(work_tree)["Add a width"]
    assert proof.without is not None and proof.without.skipped == 1
    assert not proof.ok
    assert proof.verdict == "NOT PROVEN: every test skipped without the patch"


GPU_TEST = (
    "import pytest\n\n\ndef test_kernel():\n"
    "    torch = pytest.importorskip('torch')\n"
    "    if not torch.cuda.is_available():\n"
    "        pytest.skip('needs a GPU')\n"
    "    assert False\n"
)


def test_a_declared_gpu_patch_is_reported_not_judged_without_a_gpu(work_tree: Path) -> None:
    """Fork-Proof: gpu: on a host without a GPU the patch's tests are not run as a
    proof; the verdict says so and is not counted as proven or failed."""
    _commit(
        work_tree,
        {"csrc/kernel.cu": "// faster\n", "tests/test_kernel.py": GPU_TEST},
        "A kernel change",
        "ar-rms-pack-gate",
        "change",
        "Fork-Proof: gpu\n",
    )
    [commit] = [c for c in patch_commits(work_tree) if c.subject == "A kernel change"]
    assert commit.needs_gpu
    proof = _proofs(work_tree)["A kernel change"]
    assert proof.without is None and proof.with_ is None
    assert proof.verdict == NO_GPU_HERE
    assert proof.ok


def test_an_undeclared_gpu_only_patch_is_not_proven(work_tree: Path) -> None:
    _commit(
        work_tree,
        {"csrc/kernel.cu": "// faster\n", "tests/test_kernel.py": GPU_TEST},
        "A kernel change",
        "ar-rms-pack-gate",
        "change",
    )
    proof = _proofs(work_tree)["A kernel change"]
    assert not proof.ok
    assert proof.verdict.startswith("NOT PROVEN")


def test_cli_prove_fail_exits_non_zero_on_an_erroring_series(work_tree: Path) -> None:
    from vllm_fork.cli.main import main

    _commit(
        work_tree,
        {"tests/test_gate_import.py": "from pkg.gate import missing\n\n\ndef test_x(): ...\n"},
        "Tests that fail at import",
        "ar-rms-pack-gate",
        "change",
    )
    assert main(["test", str(work_tree), "--python", sys.executable, "--prove-fail"]) == 1


def _fake_sim_repo(root: Path) -> None:
    """A fork repository whose sim/ holds a tiny stand-in of vllm_rocm_sim."""
    root.mkdir()
    (root / "bases.toml").write_text("")
    package = root / "sim" / "vllm_rocm_sim"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("ACTIVE = True\n")
    (package / "plugin.py").write_text(
        "import pytest\n\nimport vllm_rocm_sim\n\n\n"
        "@pytest.fixture\ndef rocm_sim():\n    return vllm_rocm_sim\n"
    )
    (root / "sim" / "tests").mkdir()
    (root / "sim" / "tests" / "test_self.py").write_text(
        "def test_active(rocm_sim):\n    assert rocm_sim.ACTIVE\n"
    )


def test_vllm_trees_get_the_repository_simulation(
    work_tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert sim_plugin_args(work_tree) == []  # not a vLLM tree
    root = tmp_path / "fork"
    _fake_sim_repo(root)
    monkeypatch.setenv(ENV_ROOT, str(root))
    (work_tree / "vllm").mkdir()
    (work_tree / "vllm" / "__init__.py").write_text("")
    _commit(
        work_tree,
        {
            "vllm/gate.py": "WIDE = True\n",
            "tests/test_sim_use.py": (
                "import vllm_rocm_sim\n\n\n"
                "def test_sim(rocm_sim):\n    assert rocm_sim is vllm_rocm_sim\n"
            ),
        },
        "A test on the simulation",
        "ar-rms-pack-gate",
        "tests",
    )
    args = sim_plugin_args(work_tree)
    assert args == ["-p", SIM_PLUGIN]
    outcome = run_fork_tests(work_tree, sys.executable, args)
    # the series' 5 tests and the simulation's self-test, all passing
    assert outcome.green and outcome.tests == 6


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


def test_a_failure_in_another_module_does_not_fail_this_patchs_tests() -> None:
    """One run over every judged module: each patch gets its own modules' result,
    not the run's exit status."""
    from vllm_fork.testing.forktests import PytestOutcome, TestCase

    run = PytestOutcome(
        1,
        tests=3,
        failed=1,
        errors=0,
        skipped=0,
        cases=(
            TestCase("tests.test_a.test_one", "failed"),
            TestCase("tests.test_b.test_two", "passed"),
            TestCase("tests.test_b.test_three", "passed"),
        ),
    )
    assert run.of_files(["tests/test_b.py"]).green
    assert not run.of_files(["tests/test_a.py"]).green
    assert run.of_files(["tests/test_a.py"]).failed == 1


def test_a_change_patch_without_tests_is_listed_not_proven(work_tree: Path) -> None:
    """Every change and hardening patch gets a row: one that brings no test is
    'not proven', never left out; each run logs a progress line."""
    _commit(
        work_tree,
        {"pkg/gate.py": "def gate(n):\n    return n % 16 == 0\n"},
        "Tighten the gate, untested",
        "ar-rms-pack-gate",
        "hardening",
    )
    lines: list[str] = []
    proofs = {
        p.patch.subject: p for p in prove_failing(work_tree, sys.executable, log=lines.append)
    }
    untested = proofs["Tighten the gate, untested"]
    assert untested.counts and not untested.ok
    assert untested.verdict == "NOT PROVEN: the patch brings no tests"
    assert "| Tighten the gate, untested | ar-rms-pack-gate | hardening |" in format_proofs(
        list(proofs.values())
    )
    # with every patch + one run without each of the two tested judged patches
    assert len(lines) == 3 and all(line.startswith("prove-fail: [") for line in lines)
    assert any("without Gate by pack size: " in line for line in lines)


def test_update_tests_log_progress_and_its_report_names_unproven_patches(
    work_tree: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """`update`'s tests: pytest's own output stays off stdout (where the report
    goes), a progress line per run goes to stderr, and the report names the
    patches that are not proven."""
    from vllm_fork.release import update

    monkeypatch.setattr(
        "vllm_fork.testing.treevenv.ensure_tree_venv", lambda *_a, **_k: Path(sys.executable)
    )
    monkeypatch.setattr("vllm_fork.release.check.pytest_args", lambda _tree: [])
    report = update.UpdateReport(update.DONE, "9.9.8", "9.9.9", tree=str(work_tree))
    update._test(None, work_tree, None, report)  # type: ignore[arg-type]
    out, err = capfd.readouterr()
    assert out == ""
    assert "update: fork tests: " in err and "prove-fail: [" in err
    text = update.format_update(report)
    assert "Prove-fail: 1 proven of 2 change/hardening patch(es)" in text
    assert (
        "- not proven: A hardening whose test does not depend on it "
        "(NOT PROVEN: passes without the patch)" in text
    )
    assert "..." not in text
