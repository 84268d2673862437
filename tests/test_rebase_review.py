"""The rebase review (unchanged / changed / absorbed / dropped, moved files) and
the patch lifecycle (retire-ready in status and in the rebase), on synthetic
upstream releases."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vllm_fork.cli.main import main
from vllm_fork.facts.lifecycle import retirement
from vllm_fork.facts.registry import change_ids
from vllm_fork.probes import Finding, SourceTree
from vllm_fork.rebase.engine import RebaseConflict, continue_rebase, start_rebase
from vllm_fork.reports import status as status_mod
from vllm_fork.reports.status import compute_status, format_status
from vllm_fork.tree.materialize import materialize

from .rebase_support import (
    CLEAN_SERIES,
    CONFLICT_SERIES,
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
)

KERNEL_OLD = "csrc/pos_encoding_kernels.cu"
KERNEL_NEW = "csrc/libtorch_stable/pos_encoding_kernels.cu"


def quiet(_: str) -> None:
    pass


@pytest.fixture
def fork(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Fork:
    return make_fork(tmp_path, monkeypatch, {V1: V1_FILES, V2: V2_FILES}, default=V1)


def review_of(tree: Path) -> tuple[str, dict]:
    base = tree / ".git" / "vllm-fork"
    return (base / "review.md").read_text(), json.loads((base / "review.json").read_text())


def by_subject(data: dict) -> dict[str, dict]:
    return {p["subject"]: p for p in data["patches"]}


def test_review_of_a_clean_rebase(fork: Fork, tmp_path: Path) -> None:
    fork.write_series(V1, CLEAN_SERIES)
    tree = tmp_path / "tree"
    materialize(fork.config, V1, tree)
    extra = tmp_path / "out" / "r.md"
    result = start_rebase(fork.config, V1, V2, tree, review=extra, log=quiet)

    md, data = review_of(tree)
    assert sorted(result.review) == sorted(
        str(p)
        for p in (
            tree / ".git/vllm-fork/review.md",
            tree / ".git/vllm-fork/review.json",
            extra,
            extra.with_suffix(".json"),
        )
    )
    assert extra.read_text() == md
    assert json.loads(extra.with_suffix(".json").read_text()) == data
    patches = by_subject(data)
    # Replayed untouched: range-diff finds them equal.
    assert patches[OTHER.subject]["outcome"] == "unchanged"
    assert patches[MOE_HARDENING.subject]["outcome"] == "unchanged"
    # Upstream changed a context line of the ops patch: changed, with the interdiff.
    ops = patches[OPS.subject]
    assert ops["outcome"] == "changed"
    assert "    - ops line 18\n" in ops["interdiff"]
    assert "    + ops line 18 changed upstream\n" in ops["interdiff"]
    assert ops["headers_only"] is False
    # The kernel patch followed its file: changed (new path in the interdiff).
    kernel = patches[KERNEL.subject]
    assert kernel["outcome"] == "changed" and KERNEL_NEW in kernel["interdiff"]
    # The moe change: upstream has it, with the release and the evidence.
    moe = patches[MOE.subject]
    assert moe["outcome"] == "absorbed" and moe["release"] == V2
    assert moe["evidence"] == "the 3-way merge left nothing to change"
    assert data["counts"] == {"unchanged": 2, "changed": 2, "absorbed": 1, "dropped": 0}
    # The moved file, and where the patch went.
    assert data["moved"] == [
        {
            "old_path": KERNEL_OLD,
            "new_path": KERNEL_NEW,
            "similarity": 100,
            "patches": [
                {
                    "patch": name_of(data, KERNEL.subject),
                    "went": f"follows the file to {KERNEL_NEW}",
                }
            ],
        }
    ]
    assert f"| `{KERNEL_OLD}` | `{KERNEL_NEW}` (100% similar) |" in md
    assert f"# Rebase review: vLLM {V1} -> {V2}" in md
    assert "```diff" in md and "### 2. `0002-" in md
    assert "unchanged (clean)" in md


def name_of(data: dict, subject: str) -> str:
    return by_subject(data)[subject]["patch"]


def test_review_records_the_reason_of_a_skip(
    fork: Fork, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fork.write_series(V1, CONFLICT_SERIES)
    tree = tmp_path / "tree"
    review = tmp_path / "review.md"
    assert main(["rebase", "--from", V1, "--onto", V2, "--review", str(review), str(tree)]) == 1
    assert "--skip --reason TEXT" in capsys.readouterr().out
    # A bare --skip is refused and changes nothing.
    before = (tree / ".git" / "vllm-fork-rebase.json").read_text()
    assert main(["rebase", "--skip", str(tree)]) == 2
    assert "--reason" in capsys.readouterr().err
    assert (tree / ".git" / "vllm-fork-rebase.json").read_text() == before
    assert main(["rebase", "--skip", "--reason", "upstream rewrote rope line 10", str(tree)]) == 0
    out = capsys.readouterr().out
    assert f"review: {review}" in out
    assert "change     dropped by hand (upstream rewrote rope line 10)" in out
    data = json.loads(review.with_suffix(".json").read_text())
    rope = by_subject(data)[ROPE.subject]
    assert rope["outcome"] == "dropped" and rope["reason"] == "upstream rewrote rope line 10"
    assert "reason: upstream rewrote rope line 10" in review.read_text()


def test_review_marks_a_missing_reason(fork: Fork, tmp_path: Path) -> None:
    fork.write_series(V1, CONFLICT_SERIES)
    tree = tmp_path / "tree"
    materialize(fork.config, V1, tree)
    with pytest.raises(RebaseConflict):
        start_rebase(fork.config, V1, V2, tree, log=quiet)
    continue_rebase(fork.config, tree, skip=True, log=quiet)
    md, data = review_of(tree)
    assert by_subject(data)[ROPE.subject]["reason"] == "reason missing"
    assert "**reason missing**" in md and "--skip --reason TEXT" in md


def test_review_after_a_resolved_conflict_shows_the_interdiff(fork: Fork, tmp_path: Path) -> None:
    fork.write_series(V1, CONFLICT_SERIES)
    tree = tmp_path / "tree"
    materialize(fork.config, V1, tree)
    with pytest.raises(RebaseConflict):
        start_rebase(fork.config, V1, V2, tree, log=quiet)
    resolve(tree / "vllm/rope.py", ("rope line 10 upstream version",))
    git(tree, "add", "vllm/rope.py")
    continue_rebase(fork.config, tree, log=quiet)
    _, data = review_of(tree)
    rope = by_subject(data)[ROPE.subject]
    assert rope["outcome"] == "changed"
    assert "    --rope line 10\n" in rope["interdiff"]
    assert "    +-rope line 10 upstream version\n" in rope["interdiff"]


def test_retire_ready_patch_is_proposed_for_skip(
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
    items = {
        "complete-metadata-key": True,
        "no-reuse-without-host-seqlens": True,
        "bias-precision-guard": True,
    }
    monkeypatch.setattr(
        "vllm_fork.rebase.engine.probe_upstream",
        lambda *_: {"dsv32-decode": ("present", "found upstream", items)},
    )
    with pytest.raises(RebaseConflict) as info:
        start_rebase(fork.config, V1, V2, tree, log=quiet)
    report = str(info.value)
    assert f"retire-ready: upstream {V2} absorbed dsv32-decode (probe: found upstream" in report
    assert f'--skip --reason "absorbed by upstream {V2}"' in report
    continue_rebase(fork.config, tree, skip=True, reason="upstream hardened it", log=quiet)
    _, data = review_of(tree)
    dropped = by_subject(data)[hardening.subject]
    assert dropped["outcome"] == "dropped" and dropped["reason"] == "upstream hardened it"
    assert dropped["evidence"].startswith(f"upstream {V2} has it (probe: found upstream")


def test_hardening_not_retire_ready_while_upstream_lacks_an_item() -> None:
    items = {"complete-metadata-key": True, "no-reuse-without-host-seqlens": True}
    assert retirement("dsv32-decode", "hardening", "present", "r", items, V2) is None
    items["bias-precision-guard"] = True
    assert retirement("dsv32-decode", "hardening", "present", "r", items, V2) is not None
    assert retirement("dsv32-decode", "change", "absent", "r", items, V2) is None
    assert retirement("dsv32-decode", "tests", "present", "r", items, V2) is None


def fake_probe_all(tree: SourceTree) -> dict[str, Finding]:
    """moe-bias-precast: present where moe line 5 is precast (upstream V2, or V1 + patch)."""
    moe = tree.read_text("vllm/moe.py") or ""
    precast = "moe line 5 precast once" in moe
    findings = {cid: Finding("absent", f"no {cid}") for cid in change_ids()}
    findings["moe-bias-precast"] = Finding(
        "present" if precast else "absent", "bias precast once" if precast else "cast per call"
    )
    return findings


def test_status_shows_carried_and_retire_ready(fork: Fork, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(status_mod, "probe_all", fake_probe_all)
    fork.write_series(V1, [OTHER, MOE, MOE_HARDENING])
    report = compute_status(fork.config, V1)
    lives = {life.patch.split("-", 1)[1]: life for life in report.lifecycle}
    moe = lives["ROCm-Precast-the-bias-once.patch"]
    assert moe.state == "retire-ready"
    assert moe.retire is not None and moe.retire.release == V2
    assert moe.retire.evidence() == f"upstream {V2} has it (probe: bias precast once)"
    # moe-bias-precast has no hardening items upstream could have: still carried.
    assert lives["ROCm-Guard-the-precast-bias.patch"].state == "carried"
    assert lives["Misc-Touch-other.patch"].state == "carried"
    assert report.releases_probed == (V2,)
    text = format_status(report)
    assert "retire-ready  0002-ROCm-Precast-the-bias-once.patch" in text
    assert f"upstream {V2} has it (probe: bias precast once)" in text
    assert "retires: " in text
    data = report.to_json()["lifecycle"]
    assert [d["state"] for d in data] == ["carried", "retire-ready", "carried"]
    assert data[1]["evidence"] == {"release": V2, "probe": "bias precast once"}


def test_hardening_after_a_hand_dropped_change_is_not_called_absorbed(
    fork: Fork, tmp_path: Path
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
    with pytest.raises(RebaseConflict):
        start_rebase(fork.config, V1, V2, tree, log=quiet)
    with pytest.raises(RebaseConflict) as info:
        continue_rebase(fork.config, tree, skip=True, reason="not wanted", log=quiet)
    report = str(info.value)
    assert "patch 2/2" in report
    # The change was dropped by hand, not found upstream: no claim that upstream has it.
    assert "absorbed dsv32-decode" not in report


def test_interdiff_of_hunk_headers_only() -> None:
    from vllm_fork.rebase.review import only_hunk_headers

    moved = (
        "     ## vllm/_custom_ops.py ##\n"
        "    -@@ vllm/_custom_ops.py: def old_neighbour(\n"
        "    +@@ vllm/_custom_ops.py: def new_neighbour(\n"
        "      \n"
    )
    assert only_hunk_headers(moved)
    assert not only_hunk_headers(moved + "    - ops line 18\n    + ops line 18 changed\n")
    assert not only_hunk_headers("")


def test_status_says_which_release_it_could_not_probe(
    fork: Fork, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A newer pinned release that is not in the cache, offline: status names it
    as not probed and says its patches are carried only as far as it knows."""
    from vllm_fork.sources.pins import Base, FilePin, load_pins, save_pins

    monkeypatch.setattr(status_mod, "probe_all", fake_probe_all)
    fork.write_series(V1, [OTHER, MOE])
    pins = load_pins(fork.root / "bases.toml")
    newer = "1.2.0"
    pins.bases[newer] = Base(newer, FilePin(f"vllm-{newer}.tar.gz", "0" * 64), supported=True)
    save_pins(fork.root / "bases.toml", pins)
    assert fork.config.offline
    report = compute_status(fork.config, V1)
    assert report.releases_probed == ()
    assert list(report.not_probed) == [newer]
    assert main(["--offline", "status", "--base", V1]) == 0
    out = capsys.readouterr().out
    assert "none pinned" not in out
    assert "patches (retirement not probed):" in out
    assert f"not probed: upstream {newer}: offline and not in the cache" in out
    assert "carried (not probed)  0001-" in out
    data = report.to_json()
    assert newer in data["releases_not_probed"]
