"""release-check split over several processes (a CI job per shard or base) and
merged into one report: the same report one run writes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vllm_fork.cli.main import main
from vllm_fork.errors import UsageError
from vllm_fork.release import check, merge

from .rebase_support import Fork, make_fork
from .seriesutil import edit_stored, patch_names
from .test_release import BAD, BARE, GOOD, PKG, author, change_message, reword

GOOD2 = "2.3.0"
VERSIONS = [GOOD, BAD, BARE, GOOD2]

# Each process runs the CLI with the tree's tests on this interpreter (it has
# pytest) and without the ROCm simulation, as the in-process tests do.
LAUNCHER = """\
import sys
from pathlib import Path

import vllm_fork.testing.treevenv as treevenv
from vllm_fork.cli.main import main
from vllm_fork.errors import UsageError
from vllm_fork.release import check, merge

treevenv.ensure_tree_venv = lambda *a, **k: Path(sys.executable)
check.pytest_args = lambda tree: []
sys.exit(main(sys.argv[1:]))
"""

# figures that depend on when and how fast a run went, not on what it found
TIMINGS = {"seconds", "run_seconds", "checked_at"}


def good_patch(fork: Fork, version: str) -> None:
    author(
        fork,
        version,
        {
            "vllm/layer.py": "def f(x):\n    return x + 1\n",
            "tests/test_layer.py": "from vllm.layer import f\n\n\ndef test_f():\n"
            "    assert f(1) == 2\n",
        },
        change_message("[Misc] Add one"),
    )


@pytest.fixture
def four(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Fork:
    """GOOD, GOOD2: proven changes; BAD: a test that passes without its patch;
    BARE: supported, no series."""
    fork = make_fork(tmp_path, monkeypatch, {v: PKG for v in VERSIONS}, default=GOOD)
    good_patch(fork, GOOD)
    good_patch(fork, GOOD2)
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
    monkeypatch.setattr(
        "vllm_fork.testing.treevenv.ensure_tree_venv", lambda *a, **k: Path(sys.executable)
    )
    monkeypatch.setattr(check, "pytest_args", lambda tree: [])
    return fork


def start(fork: Fork, cache: Path, *args: str) -> subprocess.Popen[str]:
    """``vllm-fork ARGS`` in a process of its own, on a cache of its own (a copy
    of the fixture's, which holds the imported synthetic releases)."""
    shutil.copytree(fork.config.cache_dir, cache)
    # one launcher file per process: rewriting a shared one while an earlier
    # process is still opening it can hand that process an empty script (exit 0,
    # no result)
    launcher = fork.tmp / f"launcher-{cache.name}.py"
    launcher.write_text(LAUNCHER)
    env = dict(
        os.environ,
        VLLM_FORK_ROOT=str(fork.root),
        VLLM_FORK_CACHE_DIR=str(cache),
        VLLM_FORK_OFFLINE="1",
        PYTHONPATH=os.pathsep.join(sys.path),
    )
    return subprocess.Popen(
        [sys.executable, str(launcher), *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def finish(proc: subprocess.Popen[str]) -> int:
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode in (0, 1), out
    return proc.returncode


def without_timings(data: object) -> object:
    if isinstance(data, dict):
        return {k: without_timings(v) for k, v in data.items() if k not in TIMINGS}
    if isinstance(data, list):
        return [without_timings(v) for v in data]
    return data


def markdown_without_times(text: str) -> list[str]:
    """The report's lines with the time column (second to last) blanked."""
    lines = []
    for line in text.splitlines():
        cells = line.split("|")
        if line.startswith("|") and len(cells) > 3:
            cells[-3] = " "
        lines.append("|".join(cells))
    return lines


def test_three_shards_in_three_processes_merge_into_one_runs_report(
    four: Fork, tmp_path: Path, capsys
) -> None:
    out = tmp_path / "out"
    t0 = time.monotonic()
    shards = [
        start(
            four,
            tmp_path / f"cache-{i}",
            "release-check",
            "--no-wheel",
            "--shard",
            f"{i}/3",
            "--out-dir",
            str(out / f"shard-{i}"),
        )
        for i in (1, 2, 3)
    ]
    codes = [finish(p) for p in shards]
    sharded_wall = time.monotonic() - t0
    t0 = time.monotonic()
    one = start(
        four,
        tmp_path / "cache-one",
        "release-check",
        "--no-wheel",
        "--json",
        str(tmp_path / "one.json"),
        "--markdown",
        str(tmp_path / "one.md"),
    )
    assert finish(one) == 1  # BAD and BARE fail
    one_wall = time.monotonic() - t0

    # every base in exactly one shard, split evenly (every third base, oldest first)
    per_shard = [sorted(p.stem for p in (out / f"shard-{i}").glob("*.json")) for i in (1, 2, 3)]
    assert per_shard == [[GOOD, GOOD2], [BAD], [BARE]]
    assert codes == [0, 1, 1]

    merged_json, merged_md = tmp_path / "merged.json", tmp_path / "merged.md"
    dirs = [str(out / f"shard-{i}") for i in (1, 2, 3)]
    code = main(
        ["release-merge", *dirs, "--json", str(merged_json)] + ["--markdown", str(merged_md)]
    )
    assert code == 1
    merged = json.loads(merged_json.read_text())
    single = json.loads((tmp_path / "one.json").read_text())
    assert [r["base"] for r in merged["bases"]] == VERSIONS
    assert merged["missing"] == []
    assert without_timings(merged) == without_timings(single)
    assert markdown_without_times(merged_md.read_text()) == markdown_without_times(
        (tmp_path / "one.md").read_text()
    )
    with capsys.disabled():
        print(
            f"\nrelease-check of {len(VERSIONS)} synthetic bases: 3 shards in 3 processes "
            f"{sharded_wall:.1f} s wall (slowest shard's run "
            f"{merged['total']['run_seconds']:.1f} s), one process {one_wall:.1f} s wall "
            f"(run {single['total']['run_seconds']:.1f} s); bases' time summed: merged "
            f"{merged['total']['seconds']:.1f} s, one run {single['total']['seconds']:.1f} s; "
            "merged report == one run's (timings aside)"
        )


def fake_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    """Steps that record figures without running anything (the merge is what is tested)."""
    figures = {
        "materialize": {"patches": 1},
        "known-issues": {"known_issues": {}},
        "tests": {"passed": 3, "failed": 0, "errors": 0, "skipped": 1},
        "prove-fail": {"proven": 1, "total": 1, "unproven": []},
    }
    monkeypatch.setattr(
        check,
        "STEP_FUNCTIONS",
        {name: (lambda ctx, data=data: dict(data)) for name, data in figures.items()},
    )


def test_a_missing_base_is_named_and_fails_the_report(
    four: Fork, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    fake_steps(monkeypatch)
    out = tmp_path / "results"
    check.release_check(four.config, [GOOD, GOOD2], wheel=False, out_dir=out)
    capsys.readouterr()
    code = main(["release-merge", str(out), "--json", str(tmp_path / "m.json")])
    text = capsys.readouterr().out
    assert code == 1
    data = json.loads((tmp_path / "m.json").read_text())
    assert data["missing"] == [BAD, BARE] and data["total"]["missing"] == 2
    assert [r["base"] for r in data["bases"]] == [GOOD, GOOD2]
    assert f"| {BAD} |" in text and "| missing |" in text
    assert "(2/4 ok, 2 missing)" in text
    assert f"- {BARE}: no result (missing)" in text
    # expecting only the bases that have a result: nothing missing, all green
    assert main(["release-merge", str(out), "--bases", GOOD, GOOD2]) == 0


def test_a_result_of_another_series_is_refused_with_one_line(
    four: Fork, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    fake_steps(monkeypatch)
    out = tmp_path / "results"
    check.release_check(four.config, [GOOD, GOOD2], wheel=False, out_dir=out)
    directory = four.series_dir(GOOD2)
    edit_stored(directory, patch_names(directory)[0], reword)
    capsys.readouterr()
    assert main(["release-merge", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("vllm-fork: error: ")
    assert f"the result of {GOOD2} was checked with another series" in err[0]
    assert "merge the results of one commit" in err[0]


def test_fields_a_newer_tool_records_are_carried_through(
    four: Fork, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A field or a step this tool does not know stays in the merged states
    (the per-base file is the whole record, not a fixed list of figures)."""
    fake_steps(monkeypatch)
    out = tmp_path / "results"
    check.release_check(four.config, [GOOD], wheel=False, out_dir=out)
    path = out / f"{GOOD}.json"
    data = json.loads(path.read_text())
    data["state"]["known_issues"] = [{"id": "KI-1", "state": "fixed"}]
    data["state"]["steps"]["later-step"] = {"status": "failed", "reason": "found", "seconds": 0}
    path.write_text(json.dumps(data))
    report = merge.merge_results(four.config, [out], [GOOD])
    [state] = report.states
    assert state.extra == {"known_issues": [{"id": "KI-1", "state": "fixed"}]}
    assert state.to_json()["known_issues"] == [{"id": "KI-1", "state": "fixed"}]
    [row] = report.to_json()["bases"]
    assert row["reasons"] == ["later-step: found"] and row["result"] == "failed"
    assert not report.passed


def test_two_different_results_of_one_base_are_refused(
    four: Fork, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_steps(monkeypatch)
    check.release_check(four.config, [GOOD], wheel=False, out_dir=tmp_path / "a")
    check.release_check(four.config, [GOOD], wheel=False, force=True, out_dir=tmp_path / "b")
    second = tmp_path / "b" / f"{GOOD}.json"
    data = json.loads(second.read_text())
    data["state"]["steps"]["tests"]["failed"] = 1  # a rerun that found another result
    second.write_text(json.dumps(data))
    with pytest.raises(UsageError, match=f"two different results of {GOOD}"):
        merge.merge_results(four.config, [tmp_path / "a", tmp_path / "b"])
    # the same file twice is one result
    report = merge.merge_results(four.config, [tmp_path / "a", tmp_path / "a"], [GOOD])
    assert [s.version for s in report.states] == [GOOD] and report.passed


def test_not_a_result_is_refused(four: Fork, tmp_path: Path) -> None:
    bad = tmp_path / "x.json"
    bad.write_text("{not json")
    with pytest.raises(UsageError, match="not a release-check result"):
        merge.merge_results(four.config, [bad])
    with pytest.raises(UsageError, match="no such result file or directory"):
        merge.merge_results(four.config, [tmp_path / "nowhere"])


@pytest.mark.parametrize("count", [1, 2, 3, 7, 25])
def test_shards_hold_every_base_once_and_differ_by_one_at_most(count: int) -> None:
    versions = [f"0.{i}.0" for i in range(20)]
    shards = [check.shard_bases(versions, (i, count)) for i in range(1, count + 1)]
    assert sorted(sum(shards, []), key=versions.index) == versions
    sizes = [len(s) for s in shards]
    assert max(sizes) - min(sizes) <= 1
    assert shards == [check.shard_bases(versions, (i, count)) for i in range(1, count + 1)]


@pytest.mark.parametrize("text", ["0/3", "4/3", "1", "a/b", "1/0", "2/-1"])
def test_a_bad_shard_is_a_usage_error(four: Fork, text: str, capsys) -> None:
    assert main(["release-check", "--no-wheel", "--shard", text]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"vllm-fork: error: --shard {text}: expected I/N with 1 <= I <= N (e.g. 2/3)"]
