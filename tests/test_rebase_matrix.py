"""`vllm-fork matrix` on synthetic upstream releases (no network)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest

from vllm_fork.cli.main import main
from vllm_fork.errors import UnknownVersionError
from vllm_fork.facts.registry import change_ids
from vllm_fork.probes import Finding
from vllm_fork.reports import matrix as matrix_mod
from vllm_fork.reports.matrix import compute_matrix, format_matrix

try:
    from .rebase_support import (
        CONFLICT_SERIES,
        OTHER,
        V1_FILES,
        V2_FILES,
        Fork,
        PatchSpec,
        git,
        make_fork,
    )
except ImportError:
    from rebase_support import (  # type: ignore[no-redef]
        CONFLICT_SERIES,
        OTHER,
        V1_FILES,
        V2_FILES,
        Fork,
        PatchSpec,
        git,
        make_fork,
    )

BELOW, BASE, MIDDLE, NEWEST = "0.9.0", "1.0.0", "1.1.0", "1.2.0"
# The synthetic trees tell the stand-in probe what upstream has, one "change state" a line.
HAS = "vllm/has.txt"


def fake_probe_all(tree) -> dict[str, Finding]:
    text = tree.read_text(HAS) or ""
    declared = dict(line.split() for line in text.splitlines() if line.strip())
    return {
        change: Finding(declared.get(change, "absent"), f"{change} per {HAS}", {"item": False})
        for change in change_ids()
    }


@pytest.fixture
def fork(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Fork:
    newest = {k: v for k, v in V2_FILES.items() if k != "vllm/ops.py"}
    releases = {
        BELOW: V1_FILES,
        BASE: V1_FILES,
        MIDDLE: {**V2_FILES, HAS: "moe-bias-precast present\n"},
        NEWEST: {**newest, HAS: "moe-bias-precast present\nar-rms-pack-gate n/a\n"},
    }
    f = make_fork(tmp_path, monkeypatch, releases, default=BASE, supported={BASE, NEWEST})
    monkeypatch.setattr("vllm_fork.reports.matrix.probe_all", fake_probe_all)
    f.write_series(BASE, CONFLICT_SERIES)
    return f


def cache_state(fork: Fork) -> tuple[str, str]:
    repo = fork.config.upstream_repo
    return (
        git(repo, "for-each-ref", "--format=%(refname) %(objectname)"),
        git(repo, "count-objects", "-v"),
    )


def test_states_and_series_per_release(
    fork: Fork, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = cache_state(fork)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    matrix = compute_matrix(fork.config)
    assert [r.version for r in matrix.rows] == [BASE, MIDDLE, NEWEST]  # 0.9.0 is older
    base, middle, newest = matrix.rows

    assert {c: base.changes[c].state for c in change_ids()} == {
        "rope-cache-dtype": "carried",
        "rope-fast-kernel": "missing",  # registered, no patch of it in this series
        "rope-bf16-buffer": "carried",
        "moe-bias-precast": "carried",
        "dsv32-decode": "carried",
        "ar-rms-pack-gate": "carried",
    }
    assert base.series_applies is True
    assert {p.result for p in base.patches} == {"applied"}

    assert {c: middle.changes[c].state for c in change_ids()} == {
        "rope-cache-dtype": "carried",
        "rope-fast-kernel": "missing",
        "rope-bf16-buffer": "carried",
        "moe-bias-precast": "upstream",
        "dsv32-decode": "conflict",
        "ar-rms-pack-gate": "carried",
    }
    by_change = {(p.change, p.part): p for p in middle.patches}
    assert by_change[("moe-bias-precast", "change")].result == "absorbed"
    assert by_change[("moe-bias-precast", "hardening")].result == "applied"
    assert by_change[("ar-rms-pack-gate", "change")].detail == "3-way merge"
    kernel = by_change[("rope-cache-dtype", "change")]
    assert kernel.result == "applied"
    assert "csrc/libtorch_stable/pos_encoding_kernels.cu" in kernel.detail
    rope = by_change[("dsv32-decode", "change")]
    assert rope.result == "failed" and "vllm/rope.py" in rope.detail
    assert middle.series_applies is False

    assert newest.changes["ar-rms-pack-gate"].state == "n/a"
    assert newest.changes["moe-bias-precast"].state == "upstream"
    assert newest.series_applies is False

    # Neither refs nor objects of the cache changed: the work went to a scratch area.
    assert cache_state(fork) == before
    assert not any(scratch.iterdir())

    table = format_matrix(matrix)
    assert "| release | rope-cache-dtype | rope-fast-kernel | rope-bf16-buffer |" in table
    assert "| 1.0.0 | carried | missing | carried | carried | carried | carried | yes |" in table
    middle_line = next(ln for ln in table.splitlines() if ln.startswith("| 1.1.0 |"))
    assert "| upstream | conflict | carried | no: 1 of 6 fail (below)" in middle_line
    assert "\n1.1.0: does not apply: 0003-" in table
    assert "(1 absorbed)" in middle_line

    data = matrix.to_json()
    assert data["series"]["base"] == BASE and len(data["series"]["patches"]) == 6
    assert [r["version"] for r in data["releases"]] == [BASE, MIDDLE, NEWEST]
    assert data["releases"][1]["changes"]["dsv32-decode"]["state"] == "conflict"
    assert data["releases"][1]["series_applies"] is False


def test_rows_are_cached_by_sdist_and_series(fork: Fork, monkeypatch: pytest.MonkeyPatch) -> None:
    first = compute_matrix(fork.config)
    assert not any(r.cached for r in first.rows)

    def must_not_run(*_args, **_kwargs):
        raise AssertionError("a cached row was recomputed")

    monkeypatch.setattr(matrix_mod, "compute_row", must_not_run)
    second = compute_matrix(fork.config)
    assert all(r.cached for r in second.rows)
    assert second.to_json() == first.to_json()

    # Another series content is another key.
    series_file = fork.series_dir(BASE) / "series"
    series_file.write_text(series_file.read_text() + "# a comment\n")
    with pytest.raises(AssertionError, match="recomputed"):
        compute_matrix(fork.config)
    monkeypatch.undo()
    monkeypatch.setattr("vllm_fork.reports.matrix.probe_all", fake_probe_all)
    third = compute_matrix(fork.config, use_cache=False)
    assert third.to_json()["releases"] == first.to_json()["releases"]


def test_release_selection(fork: Fork) -> None:
    matrix = compute_matrix(fork.config, [MIDDLE, BELOW])
    assert [r.version for r in matrix.rows] == [BELOW, MIDDLE]
    with pytest.raises(UnknownVersionError, match="2.0.0 is not pinned"):
        compute_matrix(fork.config, ["2.0.0"])


def test_unavailable_release_is_reported(fork: Fork, monkeypatch: pytest.MonkeyPatch) -> None:
    # A pinned release whose sdist is neither imported nor downloadable (offline).
    from vllm_fork.sources.pins import Base, FilePin, load_pins, save_pins

    pins = load_pins(fork.config.bases_file)
    pins.bases["1.1.5"] = Base("1.1.5", FilePin("vllm-1.1.5.tar.gz", "0" * 64))
    save_pins(fork.config.bases_file, pins)
    matrix = compute_matrix(fork.config)
    row = next(r for r in matrix.rows if r.version == "1.1.5")
    assert row.error is not None and "offline" in row.error
    assert matrix.unavailable == ["1.1.5"]
    table = format_matrix(matrix)
    assert "| 1.1.5 | ? | ? | ? | ? | ? | ? | unavailable (see below) |" in table
    assert "1.1.5: " + row.error in table


def test_cli(fork: Fork, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_file = tmp_path / "matrix.json"
    assert main(["matrix", "--releases", BASE, MIDDLE, "--json", str(out_file)]) == 0
    out = capsys.readouterr().out
    assert "| 1.1.0 |" in out and "| 1.2.0 |" not in out
    data = json.loads(out_file.read_text())
    assert [r["version"] for r in data["releases"]] == [BASE, MIDDLE]
    # --json -: stdout is the JSON alone (the table goes to stderr)
    assert main(["matrix", "--releases", BASE, MIDDLE, "--json", "-"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out) == data
    assert "| 1.1.0 |" in captured.err
    assert main(["matrix", "--releases", "7.7.7"]) == 2


def test_tests_without_the_change_are_not_carried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A series that only pins a change (tests) or hardens it brings nothing to
    # a release without the change: that release is missing it.
    pins = PatchSpec(
        "[Tests] Pin the precast", "moe-bias-precast", "tests", {"vllm/moe.py": {3: "pinned"}}
    )
    harden = PatchSpec(
        "[ROCm] Harden rope", "rope-bf16-buffer", "hardening", {"vllm/rope.py": {3: "hardened"}}
    )
    fork = make_fork(tmp_path, monkeypatch, {BASE: V1_FILES}, default=BASE)
    monkeypatch.setattr("vllm_fork.reports.matrix.probe_all", fake_probe_all)
    fork.write_series(BASE, [pins, harden])
    (base,) = compute_matrix(fork.config, [BASE], use_cache=False).rows
    assert base.changes["moe-bias-precast"].state == "missing"
    assert base.changes["rope-bf16-buffer"].state == "missing"
    assert base.series_applies is True


def test_each_release_with_its_own_series(
    fork: Fork, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """By default each release is shown with its own series (none here for
    1.1.0 and 1.2.0); --default-series projects the default base's series."""
    fork.write_series(NEWEST, [OTHER])
    assert main(["matrix"]) == 0
    out = capsys.readouterr().out
    assert "Each release's own series" in out
    assert (
        "| 1.0.0 | carried | missing | carried | carried | carried | carried | 6 patch(es) | yes |"
        in out
    )
    assert (
        "| 1.1.0 | missing | missing | missing | upstream | missing | missing | none | - |" in out
    )
    assert (
        "| 1.2.0 | missing | missing | carried | upstream | missing | n/a | 1 patch(es) | yes |"
        in out
    )
    table = out[: out.index("Own series and last release check")]
    assert max(len(line) for line in table.splitlines()) <= 160
    matrix = compute_matrix(fork.config, own=True)
    data = matrix.to_json()
    assert data["mode"] == "own"
    assert [r["series_base"] for r in data["releases"]] == [BASE, "", NEWEST]

    assert main(["matrix", "--default-series"]) == 0
    out = capsys.readouterr().out
    assert f"Series: series/{BASE} (6 patch(es)" in out
    assert "no: 1 of 6 fail (below)" in out
    assert main(["matrix", "--series", BASE, "--default-series"]) == 2
