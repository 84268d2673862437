"""The drift table (reports/drift.py): on a small synthetic series and on the real one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vllm_fork.cli.main import main
from vllm_fork.reports import drift
from vllm_fork.series import store
from vllm_fork.series.patches import load_series
from vllm_fork.sources.workspace import load_config

ROOT = Path(__file__).resolve().parents[1]


def patch(
    subject: str,
    ident: str | None,
    lines: list[str],
    *,
    change: str = "rope-cache-dtype",
    part: str = "hardening",
    index: str = "1111111",
    at: int = 10,
    extra: str = "",
) -> bytes:
    trailers = (
        f"Fork-Change: {change}\nFork-Part: {part}\nOrigin: vendor\nForwarded: no\n"
        + (f"Fork-Patch: {ident}\n" if ident else "")
        + extra
    )
    hunk = "".join(f" ctx {i}\n" for i in range(3)) + "".join(f"+{ln}\n" for ln in lines)
    return (
        "From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n"
        "From: vLLM ROCm fork maintainers <rocm-fork-maintainers@users.noreply.github.com>\n"
        "Date: Sat, 21 Nov 2026 12:00:00 +0000\n"
        f"Subject: {subject}\n\nWhy.\n\n{trailers}---\n x.py | 1 +\n\n"
        f"diff --git a/x.py b/x.py\nindex {index}..2222222 100644\n--- a/x.py\n+++ b/x.py\n"
        f"@@ -{at},3 +{at},{3 + len(lines)} @@ def f():\n{hunk}-- \n2.43.0\n\n"
    ).encode()


def write(root: Path, version: str, patches: list[bytes], comments: list[str] = ()) -> None:
    stems = [f"P{i}" for i in range(1, len(patches) + 1)]
    store.update_base(root, version, store.BaseSeries(stems, list(patches), list(comments)))


@pytest.fixture
def synthetic(tmp_path: Path) -> drift.DriftTable:
    root = tmp_path / "series"
    newest = patch("Guard the cache", "cache-guard", ["a", "b"])
    write(root, "0.20.0", [patch("Guard the cache (old title)", "cache-guard", ["a", "c", "d"])])
    # the same diff at other offsets and blob ids, another message: still "same"
    write(
        root,
        "0.21.0",
        [
            patch("Guard the cache", "cache-guard", ["a", "b"], index="3333333", at=40),
            patch("Old precast", None, ["z"], extra="Applied-Upstream: 0.22.0\n"),
            patch("Hand dropped", None, ["y"]),
        ],
    )
    write(
        root,
        "0.22.0",
        [newest],
        comments=[
            "# Dropped-By-Hand: 0.22.0 <- 0003-P3.patch (rope-cache-dtype, "
            "hardening): dropped by hand (--skip)"
        ],
    )
    series = {v: load_series(root / v) for v in ("0.20.0", "0.21.0", "0.22.0")}
    return drift.drift_table(series)


def test_drift_of_a_synthetic_series(synthetic: drift.DriftTable) -> None:
    rows = {r.id: r for r in synthetic.rows}
    assert list(rows) == ["cache-guard", "Old precast", "Hand dropped"]
    guard = rows["cache-guard"]  # the trailer names it across a subject change
    assert guard.newest == "0.22.0"
    assert guard.cells["0.22.0"].state == drift.NEWEST
    assert guard.cells["0.21.0"].state == drift.SAME
    old = guard.cells["0.20.0"]
    assert old.state == drift.ADAPTED
    assert old.detail == "1 file(s), 1 hunk(s) differ, 2 changed line(s): x.py"
    precast = rows["Old precast"]  # no trailer: the subject names it
    assert precast.cells["0.22.0"] == drift.Cell(
        drift.UPSTREAM, "Applied-Upstream: 0.22.0 (patch trailer)"
    )
    # rope-cache-dtype's code arrives in 0.20.0: the base carries no such patch
    assert precast.cells["0.20.0"].state == drift.NOT_CARRIED
    dropped = rows["Hand dropped"]
    assert dropped.cells["0.22.0"].state == drift.RETIRED
    assert "0.22.0" in dropped.cells["0.22.0"].detail
    text = drift.format_drift(synthetic)
    assert "cache-guard" in text and "adapt" in text and "retir" in text
    assert "0.20.0: adapted: 1 file(s), 1 hunk(s) differ, 2 changed line(s): x.py" in text


def test_registry_na_reason() -> None:
    a = patch("Gate", "gate", ["a"], change="ar-rms-pack-gate", part="change")
    copy = drift._Copy("0.21.0", "0001-Gate.patch", a.decode(), "ar-rms-pack-gate", "change", None)
    cell = drift._absent_reason("0.20.0", [copy], {"Gate"}, {}, ["0.20.0", "0.21.0"], {})
    assert cell.state == drift.NA and "arrives in 0.21.0" in cell.detail


def test_a_hardening_patch_is_upstream_only_once_its_bugs_are_fixed_upstream() -> None:
    """The change being upstream does not make the fork's hardening of it upstream's:
    a hardening patch absent from a base is "not carried" unless every known issue
    it fixes was fixed upstream by that release."""
    text = patch("Fix", "fix", ["a"], change="ar-rms-pack-gate").decode()
    copy = drift._Copy(
        "0.26.0", "0001-Fix.patch", text, "ar-rms-pack-gate", "hardening", None, ("bug-1",)
    )
    versions = ["0.26.0", "0.27.0", "0.33.0"]

    # what upstream's tree of each release fixes, by the register's probes
    def cell(version: str, fixed_in: dict[str, frozenset[str]]) -> drift.Cell:
        return drift._absent_reason(
            version, [copy], {"Fix"}, {}, versions, lambda v: fixed_in.get(v, frozenset())
        )

    assert cell("0.33.0", {}).state == drift.NOT_CARRIED
    assert cell("0.27.0", {"0.33.0": frozenset({"bug-1"})}).state == drift.NOT_CARRIED
    fixed = cell("0.33.0", {"0.33.0": frozenset({"bug-1"})})
    assert fixed.state == drift.UPSTREAM
    assert "bug-1: fixed upstream (known-issue probes of upstream 0.33.0)" in fixed.detail


def test_a_fix_the_base_does_not_need_is_not_affected() -> None:
    """A hardening or fix patch absent from a base whose known-issue probes find
    none of its bugs there is "not affected", with the issue named; a bug still
    there (or not probed) leaves it "not carried"."""
    text = patch("Gate", "gate", ["a"], change="ar-rms-pack-gate").decode()
    copy = drift._Copy(
        "0.24.0", "0001-Gate.patch", text, "ar-rms-pack-gate", "hardening", None, ("bug-1",)
    )
    versions = ["0.24.0", "0.25.0"]

    def cell(clean: frozenset[str]) -> drift.Cell:
        return drift._absent_reason("0.25.0", [copy], {"Gate"}, {}, versions, None, lambda v: clean)

    unaffected = cell(frozenset({"bug-1"}))
    assert unaffected.state == drift.UNAFFECTED and "bug-1: not affected" in unaffected.detail
    assert drift.SHORT[unaffected.state] == "unaff"
    assert cell(frozenset()).state == drift.NOT_CARRIED
    assert cell(frozenset({"bug-2"})).state == drift.NOT_CARRIED


def test_interdiff_ignores_only_index_lines_and_line_numbers() -> None:
    one = patch("S", "s", ["a"]).decode()
    assert drift.interdiff(one, patch("S", "s", ["a"], index="4444444", at=99).decode()).same
    context = one.replace(" ctx 1\n", " ctx one\n")
    diff = drift.interdiff(context, one)
    assert not diff.same and diff.lines == 0
    assert diff.summary() == "1 file(s), 1 hunk(s) differ, context lines only: x.py"


def test_drift_of_the_real_series(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    table = drift.compute_drift(load_config(root=ROOT))
    assert len(table.bases) == 20
    assert all(sum(c.state == drift.NEWEST for c in r.cells.values()) == 1 for r in table.rows)
    # bases with one shared series have the same column
    for group in (("0.20.0", "0.20.1", "0.20.2"), ("0.22.0", "0.22.1"), ("0.27.0", "0.27.1")):
        for row in table.rows:
            states = {row.cells[v].state for v in group if row.cells[v].state != drift.NEWEST}
            assert len(states) <= 1, (row.id, group)
    # the change the fork carried until upstream 0.20.0 took it: upstream on the newest base
    (precast,) = [r for r in table.rows if (r.change, r.part) == ("moe-bias-precast", "change")]
    assert precast.cells["0.33.0"].state == drift.UPSTREAM
    # the AITER version gate is not needed where the ROCm image pins AITER >= 0.1.14
    (gate,) = [r for r in table.rows if r.id == "ar-rms-aiter-version-gate"]
    assert gate.cells["0.33.0"].state == drift.UNAFFECTED
    assert "aiter-2890-ar-rms-2stage-ordering: not affected" in gate.cells["0.33.0"].detail
    assert table.counts()[drift.SAME] > 0
    assert table.counts()[drift.ADAPTED] > 0
    # the command prints this table (computed once: the probes take a while)
    monkeypatch.setattr(drift, "compute_drift", lambda config, versions=None, fetch=False: table)
    assert main(["status", "--drift", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["bases"] == table.bases and len(data["patches"]) == len(table.rows)
