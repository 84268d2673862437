from __future__ import annotations

import json
from pathlib import Path

import pytest

from vllm_fork.changes import status as status_mod
from vllm_fork.changes.status import compute_status, format_status
from vllm_fork.probes import Finding, SourceTree

from .conftest import ForkRepo
from .test_tree import make_series


def fake_probe_all(tree: SourceTree) -> dict[str, Finding]:
    """Probes for the synthetic base: each change keyed to something in its files."""
    layer = tree.read_text("vllm/layer.py") or ""
    kernel = tree.read_text("csrc/kernel.cu")
    carried = "return x + 33" in layer
    return {
        "rope-cache-dtype": Finding("present" if kernel else "absent", "kernel reads cache dtype"),
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
