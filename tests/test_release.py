"""release-check and update on synthetic bases: steps, resume after a kill,
a failing base reported (not crashed), update's stop on a conflict."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from vllm_fork.cli.main import main
from vllm_fork.errors import OfflineError
from vllm_fork.release import check, update
from vllm_fork.sources.pins import load_pins
from vllm_fork.sources.pipconf import PipConfig
from vllm_fork.sources.workspace import load_config

from .rebase_support import (
    CLEAN_SERIES,
    CONFLICT_SERIES,
    DATE,
    KEEP_FORK,
    V1,
    V1_FILES,
    V2,
    V2_FILES,
    Fork,
    git,
    make_fork,
    resolve,
    sdist_bytes,
)
from .seriesutil import edit_stored, patch_names

GOOD, BAD, BARE = "2.0.0", "2.1.0", "2.2.0"
LAYER = "def f(x):\n    return x\n"
PKG = {"vllm/__init__.py": "", "vllm/layer.py": LAYER}


def author(fork: Fork, version: str, files: dict[str, str], spec_message: str) -> None:
    """series/<version>: one change patch writing ``files`` (code and its test)."""
    from vllm_fork.tree.export import export
    from vllm_fork.tree.materialize import materialize

    work = fork.tmp / f"author-{version}"
    materialize(fork.config, version, work)
    for rel, content in files.items():
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        (work / rel).write_text(content)
    git(work, "add", "-A")
    env = {"GIT_AUTHOR_DATE": DATE, "GIT_COMMITTER_DATE": DATE}
    git(work, "commit", "-q", "-m", spec_message, env=env)
    export(fork.config, work)


def reword(data: bytes) -> bytes:
    """A patch with its message changed (its diff as it was)."""
    return data.replace(b"What it does.", b"What it does, reworded.")


def change_message(subject: str) -> str:
    return (
        f"{subject}\n\nWhat it does.\n\nFork-Change: ar-rms-pack-gate\nFork-Part: change\n"
        "Origin: backport, https://github.com/vllm-project/vllm/pull/1\nForwarded: no\n"
    )


@pytest.fixture
def bases(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Fork:
    """GOOD: a change whose test fails without it; BAD: a test that passes
    without its patch (not proven); BARE: supported, no series."""
    fork = make_fork(tmp_path, monkeypatch, {GOOD: PKG, BAD: PKG, BARE: PKG}, default=GOOD)
    author(
        fork,
        GOOD,
        {
            "vllm/layer.py": "def f(x):\n    return x + 1\n",
            "tests/test_layer.py": "from vllm.layer import f\n\n\ndef test_f():\n"
            "    assert f(1) == 2\n",
        },
        change_message("[Misc] Add one"),
    )
    author(
        fork,
        BAD,
        {
            "vllm/layer.py": "def f(x):\n    return x  # patched\n",
            "tests/test_layer.py": "from vllm.layer import f\n\n\ndef test_f():\n"
            "    assert f(1) == 1\n",
        },
        change_message("[Misc] A test that cannot fail"),
    )
    # The tests run with this interpreter (it has pytest), without the ROCm simulation.
    monkeypatch.setattr(
        "vllm_fork.testing.treevenv.ensure_tree_venv", lambda *a, **k: Path(sys.executable)
    )
    monkeypatch.setattr(check, "pytest_args", lambda tree: [])
    return fork


def run_check(fork: Fork, *versions: str, force: bool = False) -> check.Report:
    return check.release_check(fork.config, list(versions) or None, wheel=False, force=force)


def test_every_supported_base_is_checked_and_failures_are_reported(bases: Fork) -> None:
    report = run_check(bases)
    rows = {r["base"]: r for r in report.to_json()["bases"]}
    assert list(rows) == [GOOD, BAD, BARE]
    assert rows[GOOD]["result"] == "ok"
    assert (rows[GOOD]["passed"], rows[GOOD]["failed"]) == (1, 0)
    assert (rows[GOOD]["proven"], rows[GOOD]["proven_of"]) == (1, 1)
    assert rows[BAD]["result"] == "failed"
    assert (rows[BAD]["proven"], rows[BAD]["proven_of"]) == (0, 1)
    assert any("not proven" in r for r in rows[BAD]["reasons"])
    assert rows[BARE]["result"] == "failed"
    assert any(f"no series/{BARE}" in r for r in rows[BARE]["reasons"])
    assert not report.passed
    table = check.format_report(report)
    assert f"| {GOOD} | none affected (0) | 1 | 0 | 0 | 1/1 |" in table
    assert "**total** (1/3 ok)" in table


def test_a_wheel_build_that_cannot_run_is_a_reason(bases: Fork) -> None:
    """The synthetic base pins no upstream wheel: the precompiled build cannot
    run, and the base says why instead of stopping the check."""
    report = check.release_check(bases.config, [GOOD])
    row = report.to_json()["bases"][0]
    assert row["result"] == "failed"
    assert row["proven"] == 1
    assert row["built"] is False or row["built"] is None
    assert any(r.startswith("wheel: ") for r in row["reasons"])


def test_resume_after_a_kill_redoes_only_the_missing_steps(
    bases: Fork, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    real = dict(check.STEP_FUNCTIONS)

    def counting(name: str):
        def step(ctx: check.Context):
            calls.append(name)
            return real[name](ctx)

        return step

    def killed(ctx: check.Context):
        raise KeyboardInterrupt

    steps = {name: counting(name) for name in real}
    monkeypatch.setattr(check, "STEP_FUNCTIONS", {**steps, "prove-fail": killed})
    with pytest.raises(KeyboardInterrupt):
        run_check(bases, GOOD)
    state = check.load_state(bases.config, GOOD)
    assert state is not None and not state.finished
    assert set(state.steps) == {"materialize", "known-issues", "tests"}
    assert calls == ["materialize", "known-issues", "tests"]

    calls.clear()
    monkeypatch.setattr(check, "STEP_FUNCTIONS", steps)
    # the tree of the killed run is gone (e.g. a cleaned cache): it is made again
    report = run_check(bases, GOOD)
    assert calls == ["prove-fail"]
    assert report.passed and report.reused == set()

    calls.clear()
    again = run_check(bases, GOOD)
    assert calls == [] and again.reused == {GOOD} and again.passed
    assert "ok (recorded)" in check.format_report(again)

    run_check(bases, GOOD, force=True)
    assert calls == ["materialize", "known-issues", "tests", "prove-fail"]


def test_a_changed_series_is_checked_again(bases: Fork) -> None:
    run_check(bases, GOOD)
    before = check.load_state(bases.config, GOOD)
    directory = bases.series_dir(GOOD)
    edit_stored(directory, patch_names(directory)[0], reword)
    report = run_check(bases, GOOD)
    after = check.load_state(bases.config, GOOD)
    assert before is not None and after is not None and after.digest != before.digest
    assert report.reused == set()


def test_cli_writes_the_table_and_json(bases: Fork, tmp_path: Path, capsys) -> None:
    out_json, out_md = tmp_path / "rc.json", tmp_path / "rc.md"
    code = main(
        ["release-check", "--no-wheel", "--bases", GOOD, "--json", str(out_json)]
        + ["--markdown", str(out_md)]
    )
    assert code == 0
    data = json.loads(out_json.read_text())
    assert data["total"]["passed"] == 1 and data["total"]["bases_passed"] == 1
    assert f"| {GOOD} |" in out_md.read_text()
    assert main(["release-check", "--no-wheel", "--bases", BAD]) == 1
    rows = check.last_checks(bases.config)
    assert rows[GOOD]["result"] == "ok" and rows[BAD]["result"] == "failed"


# --- update ---------------------------------------------------------------------------


def with_index(fork: Fork, local_index, monkeypatch: pytest.MonkeyPatch, files: dict) -> None:
    """Serve V2 on the index only (bases.toml pins V1)."""
    sdist = fork.tmp / "published" / f"vllm-{V2}.tar.gz"
    sdist.parent.mkdir()
    sdist.write_bytes(sdist_bytes(V2, files))
    local_index.publish(sdist)
    monkeypatch.delenv("VLLM_FORK_OFFLINE")
    monkeypatch.setattr(
        "vllm_fork.sources.fetch.load_pip_config", lambda: PipConfig(index_url=local_index.url)
    )
    monkeypatch.setattr(
        "vllm_fork.testing.treevenv.ensure_tree_venv", lambda *a, **k: Path(sys.executable)
    )
    fork.config = load_config()


def v1_fork(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, series) -> Fork:
    fork = make_fork(tmp_path, monkeypatch, {V1: V1_FILES}, default=V1)
    fork.write_series(V1, series)
    return fork


def test_update_stops_on_a_conflict_and_says_how_to_go_on(
    tmp_path: Path, local_index, monkeypatch: pytest.MonkeyPatch
) -> None:
    fork = v1_fork(tmp_path, monkeypatch, CONFLICT_SERIES)
    with_index(fork, local_index, monkeypatch, V2_FILES)
    report = update.update(fork.config)
    assert report.status == update.STOPPED and report.exit_code == 1
    assert V2 in load_pins(fork.config.bases_file).bases and report.pinned == [V2]
    results = [p["result"] for p in report.patches]
    assert results[:2] == ["applied", "applied"]
    assert results[2] == "conflict: needs a maintainer"
    tree = Path(report.tree or "")
    assert f"vllm-fork rebase --continue {tree}" in report.next_steps
    assert not fork.series_dir(V2).exists()
    text = update.format_update(report)
    assert "rebase --continue" in text and "CONFLICT" in text
    # running it again destroys nothing: the stopped rebase is reported as is
    head = git(tree, "rev-parse", "HEAD")
    again = update.update(fork.config)
    assert again.status == update.IN_PROGRESS and again.tree == str(tree)
    assert git(tree, "rev-parse", "HEAD") == head


def test_update_rebases_tests_and_reports_absorbed_patches(
    tmp_path: Path, local_index, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    fork = v1_fork(tmp_path, monkeypatch, CLEAN_SERIES)
    with_index(fork, local_index, monkeypatch, V2_FILES)
    code = main(["update"])
    out = capsys.readouterr().out
    assert code == 1  # the synthetic series has no tests: reported as a problem
    data = json.loads((fork.root / "work" / f"update-{V2}-report.json").read_text())
    assert data["status"] == update.DONE
    results = {p["subject"]: p["result"] for p in data["patches"]}
    assert results["[ROCm] Precast the bias once"] == "absorbed"
    assert results["[ROCm] Read the cache in its own dtype"] == "applied"
    assert (fork.series_dir(V2) / "series").is_file()
    assert any("adds no test modules" in p for p in data["problems"])
    assert "absorbed" in out
    # nothing newer now
    assert update.update(fork.config).status == update.UP_TO_DATE


def test_update_offline_fails_with_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    fork = v1_fork(tmp_path, monkeypatch, CLEAN_SERIES)
    with pytest.raises(OfflineError):
        update.update(fork.config)
    assert main(["--offline", "update"]) != 0
    # notes of the fixture's own set-up may come before it: one error line, no more
    err = capsys.readouterr().err
    assert "Traceback" not in err
    errors = [ln for ln in err.splitlines() if ln.startswith("vllm-fork: error")]
    assert errors == [
        "vllm-fork: error: update reads the package index for new releases; it cannot run offline"
    ]


def test_matrix_shows_each_release_series_and_last_check(bases: Fork, capsys) -> None:
    run_check(bases, GOOD)
    capsys.readouterr()
    main(["matrix", "--releases", GOOD, BAD, BARE, "--series", GOOD])
    out = capsys.readouterr().out
    assert f"| {GOOD} | series/{GOOD} | ok at " in out
    assert "| 1/0/0 | 1/1 | - |" in out
    assert f"| {BAD} | series/{BAD} | never |" in out
    assert f"| {BARE} | - | never |" in out


def test_update_tests_the_series_once_the_maintainer_finished_the_rebase(
    tmp_path: Path, local_index, monkeypatch: pytest.MonkeyPatch
) -> None:
    fork = v1_fork(tmp_path, monkeypatch, CONFLICT_SERIES)
    with_index(fork, local_index, monkeypatch, V2_FILES)
    assert main(["update"]) == 1
    tree = fork.root / "work" / f"update-{V2}"
    resolve(tree / "vllm/rope.py", KEEP_FORK)
    git(tree, "add", "vllm/rope.py")
    assert main(["rebase", "--continue", str(tree)]) == 0
    assert (fork.series_dir(V2) / "series").is_file()
    main(["update"])
    data = json.loads((fork.root / "work" / f"update-{V2}-report.json").read_text())
    assert data["status"] == update.DONE and data["tree"] == str(tree)
    # the tests ran (the synthetic series has none: that is the problem reported)
    assert any("adds no test modules" in p for p in data["problems"])
    assert any("release-check --bases" in step for step in data["next_steps"])


@pytest.mark.parametrize(
    "says",
    [
        "ERROR: No matching distribution found for certifi>=2099.1.1",  # pip
        "error: No solution found when resolving dependencies\n  cause: Because only "
        "certifi<=2026.10.19 is available and you require certifi>=2099.1.1, we can "
        "conclude that your requirements are unsatisfiable.",  # uv
        "  cause: Because there is no version of certifi>=2099.1.1 and you require "
        "certifi>=2099.1.1, we can conclude ...",  # uv, nothing in range
    ],
)
def test_a_requirement_the_index_lacks_is_relaxed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, says: str
) -> None:
    from vllm_fork.testing import treevenv

    reqs = tmp_path / "requirements" / "common.txt"
    reqs.parent.mkdir()
    reqs.write_text("regex  # comment\ncertifi >= 2099.1.1\nnumpy; python_version > '3'\n")
    seen: list[str] = []

    def install(tool: object, python: Path, *args: str) -> None:
        text = Path(args[1]).read_text()
        seen.append(text)
        if "certifi>=2099" in text.replace(" ", ""):
            raise treevenv.TreeVenvError(f"install failed:\n{says}")

    monkeypatch.setattr(treevenv, "_install", install)
    treevenv._install_requirements(None, Path("python"), reqs)
    assert len(seen) == 2
    assert "certifi\n" in seen[1] and "regex" in seen[1] and "numpy" in seen[1]
    assert list(reqs.parent.iterdir()) == [reqs]  # the rewritten copy is gone

    def no_index(tool: object, python: Path, *args: str) -> None:
        raise treevenv.TreeVenvError("ERROR: Could not install, network down")

    monkeypatch.setattr(treevenv, "_install", no_index)
    with pytest.raises(treevenv.TreeVenvError, match="network down"):
        treevenv._install_requirements(None, Path("python"), reqs)


def test_a_crashed_step_is_reported_then_redone(
    bases: Fork, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = dict(check.STEP_FUNCTIONS)

    def crash(ctx: check.Context):
        raise RuntimeError("tool install broken")

    monkeypatch.setattr(check, "STEP_FUNCTIONS", {**real, "materialize": crash})
    row = run_check(bases, GOOD).to_json()["bases"][0]
    assert row["result"] == "failed"
    assert "materialize: internal error: RuntimeError: tool install broken" in row["reasons"]
    assert "tests: no work tree" in row["reasons"]
    monkeypatch.setattr(check, "STEP_FUNCTIONS", real)
    again = run_check(bases, GOOD)
    assert again.passed and again.reused == set()


def test_the_check_counts_where_upstreams_sdist_and_wheel_disagree(bases: Fork) -> None:
    """With the pinned upstream wheel in the cache, the materialize step records the
    Python files upstream's sdist and wheel disagree on (nothing is downloaded)."""
    import hashlib
    from dataclasses import replace

    from vllm_fork.sources.pins import FilePin, save_pins

    from .wheelutil import version_py, write_wheel

    files = {
        "vllm/__init__.py": b"NEWER = True\n",  # the sdist's is empty
        "vllm/layer.py": LAYER.encode(),  # the same as the sdist's
        "vllm/_version.py": version_py(GOOD),
    }
    wheel = write_wheel(
        bases.tmp / f"vllm-{GOOD}-cp38-abi3-manylinux_2_28_x86_64.whl",
        files,
        GOOD,
        "cp38-abi3-manylinux_2_28_x86_64",
    )
    pin = FilePin(wheel.name, hashlib.sha256(wheel.read_bytes()).hexdigest())
    pins = load_pins(bases.config.bases_file)
    pins.bases[GOOD] = replace(pins.bases[GOOD], wheel=pin)
    save_pins(bases.config.bases_file, pins)
    report = run_check(bases, GOOD, BAD)
    rows = {r["base"]: r for r in report.to_json()["bases"]}
    assert rows[BAD]["sdist_wheel_disagree"] is None  # no wheel pinned
    assert rows[GOOD]["sdist_wheel_disagree"] is None  # pinned, not in the cache
    cached = bases.config.fetcher.cached_path(pin)
    cached.parent.mkdir(parents=True, exist_ok=True)
    cached.write_bytes(wheel.read_bytes())
    report = run_check(bases, GOOD, force=True)
    [row] = report.to_json()["bases"]
    assert row["sdist_wheel_disagree"] == 1
    assert "| 1 |" in check.format_report(report)


def test_a_check_recorded_before_a_new_step_runs_that_step_only(
    bases: Fork, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A result recorded by a tool with fewer steps is complete for those: a rerun
    runs only the steps it lacks (here the installed-wheel check)."""
    calls: list[str] = []
    wheel = bases.tmp / "vllm-fake.whl"
    wheel.write_bytes(b"not read")

    def fake(name: str, result: dict):
        def step(ctx: check.Context):
            calls.append(name)
            return dict(result)

        return step

    steps = {
        "materialize": fake("materialize", {"patches": 1}),
        "tests": fake("tests", {"passed": 1, "failed": 0, "errors": 0, "skipped": 0}),
        "prove-fail": fake("prove-fail", {"proven": 1, "total": 1, "unproven": []}),
        "wheel": fake("wheel", {"wheel": str(wheel), "built": True, "verified": True}),
        "install": fake("install", {"installed": True, "checks": 3}),
    }
    monkeypatch.setattr(check, "STEP_FUNCTIONS", steps)
    monkeypatch.setattr(check, "STEPS", ("materialize", "tests", "prove-fail", "wheel"))
    first = check.release_check(bases.config, [GOOD])
    assert first.passed and calls == ["materialize", "tests", "prove-fail", "wheel"]
    assert first.to_json()["bases"][0]["installed"] is None

    calls.clear()
    monkeypatch.setattr(check, "STEPS", ("materialize", "tests", "prove-fail", "wheel", "install"))
    second = check.release_check(bases.config, [GOOD])
    assert calls == ["install"]
    row = second.to_json()["bases"][0]
    assert row["installed"] is True and second.passed
    assert second.to_json()["total"]["wheels_installed"] == 1

    calls.clear()
    third = check.release_check(bases.config, [GOOD])
    assert calls == [] and third.reused == {GOOD}


def test_no_wheel_means_no_install_check(bases: Fork) -> None:
    row = check.release_check(bases.config, [GOOD]).to_json()["bases"][0]
    assert "install: no wheel" in row["reasons"]
    assert row["installed"] is False


# --- the tool's release tests (step tool-tests) -----------------------------------------

RELEASE_TEST = """import os

import pytest


@pytest.mark.release
def test_long():
    assert os.environ["VLLM_FORK_RELEASE_TESTS"] == "1"
    assert os.environ["VLLM_FORK_E2E_BUILD"] == "1"
    assert {outcome}


def test_quick():
    raise AssertionError("not a release test: -m release leaves it out")
"""


def write_suite(root: Path, outcome: str = "True") -> None:
    suite = root / "tests"
    suite.mkdir(exist_ok=True)
    (suite / "conftest.py").write_text("")
    (suite / "test_tool.py").write_text(RELEASE_TEST.format(outcome=outcome))


def test_the_tools_release_tests_run_with_the_default_base_and_again_when_they_change(
    bases: Fork, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Step tool-tests runs `pytest -m release` of the checkout once, with the
    default base (GOOD) and no other; a change of the tool's sources redoes it
    alone, and a failing release test fails the default base."""
    calls: list[tuple[str, str]] = []
    real = dict(check.STEP_FUNCTIONS)
    wheel = bases.tmp / "vllm-fake.whl"
    wheel.write_bytes(b"not read")
    figures = {
        "materialize": {"patches": 1},
        "known-issues": {"known_issues": {}},
        "tests": {"passed": 1, "failed": 0, "errors": 0, "skipped": 0},
        "prove-fail": {"proven": 1, "total": 1, "unproven": []},
        "wheel": {"wheel": str(wheel), "built": True, "verified": True},
        "install": {"installed": True, "checks": 3},
    }

    def counted(name: str):
        def step(ctx: check.Context):
            calls.append((ctx.version, name))
            return dict(figures[name]) if name in figures else real[name](ctx)

        return step

    monkeypatch.setattr(check, "STEP_FUNCTIONS", {name: counted(name) for name in real})
    write_suite(bases.root)
    report = check.release_check(bases.config, [GOOD, BAD])
    assert [name for v, name in calls if v == GOOD][-1] == check.TOOL_TESTS
    assert (BAD, check.TOOL_TESTS) not in calls
    assert report.passed
    rows = {r["base"]: r for r in report.to_json()["bases"]}
    assert rows[BAD]["tool_tests"] is None
    tool = rows[GOOD]["tool_tests"]
    assert (tool["result"], tool["passed"], tool["failed"], tool["skipped"]) == ("ok", 1, 0, 0)
    assert f"- with {GOOD}: ok: 1 passed, 0 failed, 0 errors, 0 skipped" in check.format_report(
        report
    )

    calls.clear()
    assert check.release_check(bases.config, [GOOD]).reused == {GOOD} and calls == []

    write_suite(bases.root, outcome="False")
    report = check.release_check(bases.config, [GOOD])
    assert calls == [(GOOD, check.TOOL_TESTS)]
    row = report.to_json()["bases"][0]
    assert row["result"] == "failed" and not report.passed
    assert row["tool_tests"]["failed"] == 1
    assert any(
        r.startswith("tool-tests: the tool's release tests: 0 passed, 1 failed")
        for r in row["reasons"]
    )


def test_without_a_test_suite_the_tool_tests_say_why(bases: Fork) -> None:
    report = check.release_check(bases.config, [GOOD])
    row = report.to_json()["bases"][0]
    assert row["tool_tests"]["result"] == "failed"
    assert any(r.startswith("tool-tests: no test suite at ") for r in row["reasons"])
    assert (
        check.release_check(bases.config, [GOOD], wheel=False).to_json()["bases"][0]["tool_tests"]
        is None
    )
