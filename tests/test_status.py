from __future__ import annotations

import json
from pathlib import Path

import pytest

from vllm_fork.probes import Finding, SourceTree
from vllm_fork.reports import status as status_mod
from vllm_fork.reports.status import compute_status, format_status

from .buildutil import full_csrc_patch
from .buildutil import make_series as make_series_of
from .conftest import ForkRepo
from .gitutil import commit, trailer_block
from .test_tree import make_series


def fake_probe_all(tree: SourceTree) -> dict[str, Finding]:
    """Probes for the synthetic base: each change keyed to something in its files."""
    layer = tree.read_text("vllm/layer.py") or ""
    kernel = tree.read_text("csrc/kernel.cu")
    fast = tree.read_text("csrc/fast.cu")
    carried = "return x + 33" in layer
    return {
        "rope-cache-dtype": Finding("present" if kernel else "absent", "kernel reads cache dtype"),
        "rope-fast-kernel": Finding("present" if fast else "absent", "vectorized kernel"),
        "rope-bf16-buffer": Finding("absent", "no bf16 buffer"),
        "moe-bias-precast": Finding("n/a", "no AITER MoE router in this base"),
        "dsv32-decode": Finding("absent", "no metadata cache"),
        "ar-rms-pack-gate": Finding(
            "present" if carried else "absent",
            "pack-size gate" if carried else "hidden-size whitelist",
            {"two-stage-switch": carried},
        ),
    }


@pytest.fixture
def probes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(status_mod, "probe_all", fake_probe_all)


def states(report: status_mod.StatusReport) -> dict[str, str]:
    return {c.change: c.state for c in report.changes}


def test_status_without_series(fork_repo: ForkRepo, probes: None) -> None:
    report = compute_status(fork_repo.config, None)
    assert states(report) == {
        "rope-cache-dtype": "upstream",
        "rope-fast-kernel": "missing",
        "rope-bf16-buffer": "missing",
        "moe-bias-precast": "n/a",
        "dsv32-decode": "missing",
        "ar-rms-pack-gate": "missing",
    }
    assert report.patches == ()


def test_status_with_series_applied_in_a_temporary_index(
    fork_repo: ForkRepo, probes: None, tmp_path: Path
) -> None:
    make_series(fork_repo, tmp_path)
    report = compute_status(fork_repo.config, "9.9.9")
    assert states(report)["ar-rms-pack-gate"] == "carried"
    by_change = {c.change: c for c in report.changes}
    assert by_change["ar-rms-pack-gate"].patches == (
        "0001-ROCm-Change-f3.patch",
        "0002-ROCm-Tests-Cover-f3.patch",
    )
    assert by_change["dsv32-decode"].patches == ()
    assert by_change["ar-rms-pack-gate"].hardening == {"two-stage-switch": True}
    assert by_change["moe-bias-precast"].reason == "no AITER MoE router in this base"
    data = json.loads(json.dumps(report.to_json()))
    assert data["base"] == "9.9.9"
    assert data["changes"]["ar-rms-pack-gate"]["state"] == "carried"
    text = format_status(report)
    assert "ar-rms-pack-gate  carried" in text and "<- 0001-ROCm-Change-f3.patch" in text


def test_status_of_a_work_tree_on_disk(fork_repo: ForkRepo, probes: None, tmp_path: Path) -> None:
    tree = make_series(fork_repo, tmp_path)
    report = compute_status(fork_repo.config, None, tree)
    by_change = {c.change: c for c in report.changes}
    assert by_change["ar-rms-pack-gate"].state == "carried"
    assert by_change["ar-rms-pack-gate"].patches == ("[ROCm] Change f3", "[ROCm][Tests] Cover f3")
    # an uncommitted edit that undoes the change is seen
    layer = tree / "vllm/layer.py"
    layer.write_text(layer.read_text().replace("x + 33", "x + 3"))
    report = compute_status(fork_repo.config, None, tree)
    assert states(report)["ar-rms-pack-gate"] == "missing"


def test_status_marks_a_full_build_only_change(
    fork_repo: ForkRepo, probes: None, tmp_path: Path
) -> None:
    tree = make_series_of(fork_repo, tmp_path, full_csrc_patch)
    for report in (
        compute_status(fork_repo.config, "9.9.9"),
        compute_status(fork_repo.config, None, tree),
    ):
        by_change = {c.change: c for c in report.changes}
        fast = by_change["rope-fast-kernel"]
        assert (fast.state, fast.full_build_only) == ("carried", True)
        assert not by_change["ar-rms-pack-gate"].full_build_only
        assert report.to_json()["changes"]["rope-fast-kernel"]["full_build_only"] is True
        text = format_status(report)
        assert "full build only (Fork-Build: full): a precompiled wheel lacks it" in text
        assert text.count("full build only") == 1


def _check_before_the_kernel(tree: Path) -> None:
    """A hardening patch of rope-fast-kernel in Python, left in a precompiled build."""
    commit(
        tree,
        "[Misc] Check before the kernel",
        "Python-side check.",
        trailer_block(change="rope-fast-kernel", part="hardening", origin="vendor"),
        {"vllm/check.py": "def check():\n    return True\n"},
    )


def test_status_says_what_a_precompiled_wheel_has_of_a_partly_full_change(
    fork_repo: ForkRepo, probes: None, tmp_path: Path
) -> None:
    tree = make_series_of(fork_repo, tmp_path, full_csrc_patch, _check_before_the_kernel)
    for report in (
        compute_status(fork_repo.config, "9.9.9"),
        compute_status(fork_repo.config, None, tree),
    ):
        fast = {c.change: c for c in report.changes}["rope-fast-kernel"]
        # the full build has it; a precompiled one lacks the kernel, keeps the check
        assert (fast.state, fast.full_build_only) == ("carried", False)
        assert fast.precompiled is not None
        assert fast.precompiled.state == "missing"
        assert len(fast.precompiled.left_out) == 1
        assert "Vectorize the kernel" in fast.precompiled.left_out[0].replace("-", " ")
        data = report.to_json()["changes"]
        assert data["rope-fast-kernel"]["precompiled"]["state"] == "missing"
        assert data["ar-rms-pack-gate"]["precompiled"] is None
        text = format_status(report)
        assert text.count("precompiled wheel (leaves out") == 1
        assert "full build only" not in text


def test_reports_read_the_cache_unless_asked_to_fetch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """status, status --drift and matrix download nothing by default: a release
    not in the cache is named as not covered (with how to fetch it) and the
    command still succeeds; `--fetch` fetches it."""
    from vllm_fork.cli.main import main
    from vllm_fork.errors import NetworkError
    from vllm_fork.sources.fetch import Fetcher

    from .rebase_support import OTHER, V1, V1_FILES, V2, V2_FILES, git, make_fork

    fork = make_fork(tmp_path, monkeypatch, {V1: V1_FILES, V2: V2_FILES}, default=V1)
    fork.write_series(V1, [OTHER])
    git(fork.config.upstream_repo, "tag", "-d", f"upstream/{V2}")  # V2 not in the cache
    monkeypatch.delenv("VLLM_FORK_OFFLINE")
    asked: list[str] = []

    def no_network(self: Fetcher, pin, *args: object, **kwargs: object) -> Path:
        asked.append(pin.filename)
        raise NetworkError(f"{pin.filename}: no network in this test")

    monkeypatch.setattr(Fetcher, "ensure", no_network)

    assert main(["status", "--base", V1]) == 0
    out = capsys.readouterr().out
    assert f"not probed: upstream {V2}: not in the cache: not covered (`--fetch`" in out
    assert main(["status", "--drift"]) == 0
    assert main(["matrix", "--releases", V1, V2]) == 0
    out = capsys.readouterr().out
    assert f"| {V2} | " in out and "not in the cache (see below)" in out
    assert f"{V2}: not in the cache: not covered (`--fetch` fetches it" in out
    assert asked == []  # nothing was downloaded, or tried

    assert main(["matrix", "--releases", V2, "--fetch"]) == 1  # asked to: it tries
    assert asked == [f"vllm-{V2}.tar.gz"]
    assert main(["status", "--base", V1, "--fetch"]) == 0
    assert asked[1:] == [f"vllm-{V2}.tar.gz"]
    assert f"not probed: upstream {V2}: vllm-{V2}.tar.gz: no network" in capsys.readouterr().out
