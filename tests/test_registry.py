"""The change registry: its tables, its agreement with the series, the state
rule, and a made-up change that every command picks up from the registry alone."""

from __future__ import annotations

import dataclasses
import functools
import re
import shutil
from pathlib import Path

import pytest

from vllm_fork import __version__
from vllm_fork.build.provenance import format_record, make_record
from vllm_fork.diffs import touched_paths
from vllm_fork.errors import ForkError
from vllm_fork.facts import registry
from vllm_fork.facts.state import decide
from vllm_fork.probes import ABSENT, NA, PRESENT, Finding, SourceTree, probe, probe_fn
from vllm_fork.reports import tables
from vllm_fork.reports.matrix import compute_matrix, format_matrix
from vllm_fork.reports.status import compute_status, format_status
from vllm_fork.series import store
from vllm_fork.series.patches import load_series
from vllm_fork.sources.pins import load_pins
from vllm_fork.testing.forktests import is_test_module

from .rebase_support import PatchSpec, make_fork, numbered, text

ROOT = Path(__file__).resolve().parents[1]

# --------------------------------------------------------------------------- the documents


def test_document_tables_are_the_generated_ones() -> None:
    """README.md and docs/changes.md carry exactly the registry's tables
    (regenerate with `python -m vllm_fork.reports.tables --write`)."""
    assert tables.stale(ROOT) == []


def test_a_hand_edited_table_is_stale(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the known-issue table probes every base: the same for the four renderings
    # below (the edit is to another table), computed once
    once = functools.cache(tables.known_issues_table)
    monkeypatch.setitem(tables.TABLES, "known-issues", (tables.README, once))
    for name in ("bases.toml", tables.README, tables.CHANGES_DOC):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text((ROOT / name).read_text())
    (tmp_path / "series").symlink_to(ROOT / "series")
    readme = tmp_path / tables.README
    readme.write_text(readme.read_text().replace("(#41113)", "(#41114)"))
    assert tables.stale(tmp_path) == [tables.README]
    assert tables.main(["--check", "--root", str(tmp_path)]) == 1
    assert tables.main(["--write", "--root", str(tmp_path)]) == 0
    assert tables.stale(tmp_path) == []


# --------------------------------------------------------------------------- registry vs series


def _series_versions() -> list[str]:
    return store.versions(ROOT / "series")


@pytest.mark.parametrize("version", _series_versions())
def test_registry_names_every_file_and_test_a_patch_touches(version: str) -> None:
    series = load_series(ROOT / "series" / version)
    support = {s.id: s for s in registry.SUPPORT}
    for patch, header in zip(series.patches, series.headers, strict=True):
        paths = touched_paths(patch.read_text(encoding="utf-8", errors="replace"))
        if header.change in support:
            prefixes = support[header.change].files
            assert all(p.startswith(prefixes) for p in paths), (patch.name, paths)
            continue
        change = registry.get(header.change)
        # a patch's test modules need no registry line: the docs' table of fork tests
        # reads them from the series (a backported fix brings its tests as data)
        tests = {p for p in paths if is_test_module(p)}
        assert tests <= _documented_tests(change.id), (patch.name, tests)
        code = {p for p in paths if not p.startswith("tests/")}
        assert code <= set(change.files_at(version)), (patch.name, code)


def _documented_tests(change_id: str) -> set[str]:
    """The fork tests docs/changes.md lists for a change (its lifecycle table row)."""
    text = (ROOT / "docs" / "changes.md").read_text()
    block = text[text.index("tables --write (lifecycle) -->") :]
    row = next(line for line in block.splitlines() if line.startswith(f"| `{change_id}` |"))
    return set(re.findall(r"`(tests/[^`]+)`", row))


def test_registry_entries_are_complete() -> None:
    ids = registry.change_ids()
    assert len(set(ids)) == len(ids)
    # the built-in changes; a maintainer's own change (local-changes.toml) is data and
    # may have no files or tests yet (it then shows as NOT PROVEN in prove-fail)
    for change in registry.CHANGES:
        assert callable(probe_fn(change)), change.id
        assert change.files and change.tests, change.id
        for line in (change.title, change.why, change.retire_when):
            assert line and "\n" not in line, change.id
        if change.pr is None:  # a vendor change: no upstream PR to name
            assert change.pr_url is None and change.upstream_since is None, change.id
        else:
            assert change.pr_url is not None and change.pr_url.endswith(f"/pull/{change.pr}")
    with pytest.raises(ValueError, match="unknown change id"):
        registry.get("no-such-change")


# --------------------------------------------------------------------------- the state rule


@pytest.mark.parametrize(
    ("base", "parts", "kwargs", "expected"),
    [
        (PRESENT, ["tests"], {}, "upstream"),
        (PRESENT, ["change", "hardening"], {"failed": True}, "upstream"),
        (NA, ["change"], {}, "n/a"),
        (ABSENT, [], {}, "missing"),
        (ABSENT, ["hardening", "tests"], {}, "missing"),
        (ABSENT, ["change"], {"failed": True}, "conflict"),
        (ABSENT, ["change"], {"patched": ABSENT}, "missing"),
        (ABSENT, ["change", "hardening"], {"patched": PRESENT}, "carried"),
        (ABSENT, ["change"], {}, "carried"),
    ],
)
def test_state_rule(base: str, parts: list[str], kwargs: dict, expected: str) -> None:
    assert decide(base, parts, **kwargs) == expected


# --------------------------------------------------------------------------- a sixth change

SIXTH = "made-up-sixth"
SIXTH_FILE = "vllm/sixth.py"
SLOW, FAST, GUARD = "sixth line 3", "sixth line 3 fast path", "sixth line 5 guarded"


def probe_sixth(tree: SourceTree) -> Finding:
    """The made-up change's probe: a fast path on line 3, its hardening on line 5."""
    source = tree.read_text(SIXTH_FILE)
    if source is None:
        return Finding(NA, f"no {SIXTH_FILE}")
    lines = source.splitlines()
    if lines[2] != FAST:
        return Finding(ABSENT, f"{SIXTH_FILE} takes the slow path")
    return Finding(PRESENT, f"{SIXTH_FILE} takes the fast path", {"guard": lines[4] == GUARD})


SIXTH_CHANGE = registry.Change(
    id=SIXTH,
    title="A made-up change for the tests",
    pr=99999,
    upstream_since="1.1.0",
    applies_since="1.0.0",
    files=(registry.Landing(SIXTH_FILE),),
    hardening=(registry.Hardening("guard", "line 5 is guarded"),),
    probe=f"{__name__}:probe_sixth",
    tests=(),
    why="the tests need a change the tool's code has never heard of",
    retire_when="never",
)

BELOW, BASE, NEWER = "0.9.0", "1.0.0", "1.1.0"
SIXTH_SERIES = [
    PatchSpec("[Perf] Take the fast path", SIXTH, "change", {SIXTH_FILE: {3: FAST}}),
    PatchSpec("[Misc] Guard the fast path", SIXTH, "hardening", {SIXTH_FILE: {5: GUARD}}),
]


def test_a_made_up_sixth_change_needs_only_a_registry_entry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lines = numbered("sixth", 8)
    releases = {
        BELOW: {"vllm/other.py": "x = 1\n"},  # no vllm/sixth.py: n/a
        BASE: {SIXTH_FILE: text(lines)},
        NEWER: {SIXTH_FILE: text([*lines[:2], FAST, *lines[3:]])},  # upstream took it
    }
    fork = make_fork(tmp_path, monkeypatch, releases, default=BASE)
    five = registry.CHANGES
    monkeypatch.setattr(registry, "CHANGES", (*five, SIXTH_CHANGE))
    fork.write_series(BASE, SIXTH_SERIES)
    names = [p.name for p in load_series(fork.series_dir(BASE)).patches]

    # the probes dispatch to it, with its registered hardening items
    assert probe(SIXTH, fork_tree(fork, NEWER)).hardening == {"guard": False}

    # status
    report = compute_status(fork.config, BASE)
    sixth = {c.change: c for c in report.changes}[SIXTH]
    assert (sixth.state, sixth.patches, sixth.hardening) == (
        "carried",
        tuple(names),
        {"guard": True},
    )
    assert re.search(
        rf"^  {SIXTH} +carried +{SIXTH_FILE} takes the fast path", format_status(report), re.M
    )
    assert {c.change for c in report.changes} == {*(c.id for c in five), SIXTH}

    # matrix
    matrix = compute_matrix(fork.config, [BELOW, BASE, NEWER], BASE, use_cache=False)
    assert matrix.changes[-1] == SIXTH
    cells = {row.version: row.changes[SIXTH] for row in matrix.rows}
    assert {v: c.state for v, c in cells.items()} == {
        BELOW: "n/a",
        BASE: "carried",
        NEWER: "upstream",
    }
    assert cells[BASE].patches == names
    newer = next(row for row in matrix.rows if row.version == NEWER)
    assert [p.result for p in newer.patches] == ["absorbed", "applied"]
    assert f"| {SIXTH} | series applies |" in format_matrix(matrix)

    # provenance: the hardening patch (no backport origin) names the registry's PR
    record = make_record(
        base=load_pins(fork.config.bases_file).get(BASE),
        series=load_series(fork.series_dir(BASE)),
        version=f"{BASE}+hardened.1",
        revision=1,
        mode="empty",
        device="cuda",
        tool_version=__version__,
    )
    entries = {p["part"]: p for p in record.to_json()["series"]["patches"]}
    assert entries["hardening"]["change"] == SIXTH
    assert entries["hardening"]["upstream_pr"] == SIXTH_CHANGE.pr_url
    assert f"[{SIXTH}/hardening]  {SIXTH_CHANGE.pr_url}" in format_record(record)

    # without the registry entry the same series is refused: the entry is what did it
    monkeypatch.setattr(registry, "CHANGES", five)
    with pytest.raises(ForkError, match=SIXTH):
        # a new command, so a new workspace: the series is read (and validated) again
        compute_status(dataclasses.replace(fork.config), BASE)


def fork_tree(fork, version: str):
    from vllm_fork.facts.names import tag_for
    from vllm_fork.probes import GitTree

    return GitTree(fork.config.upstream_repo, tag_for(version))


def test_a_hardening_item_scoped_to_older_bases_is_left_out_after_them() -> None:
    change = registry.get("rope-cache-dtype")
    assert "bounded-dispatch" in change.hardening_at("0.20.2")
    assert "bounded-dispatch" not in change.hardening_at("0.21.0")
    found = {"python-dtype-check": True, "bounded-dispatch": False, "empty-batch": True}
    assert change.scoped_hardening("0.33.0", found) == {
        "python-dtype-check": True,
        "empty-batch": True,
    }
    assert change.scoped_hardening("0.20.0", found) == found


def test_a_maintainers_own_change_is_declared_as_data(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`vllm-fork change add` declares a local change in local-changes.toml; a
    patch of it then exports, and status, matrix, provenance and release notes
    show it like the fork's own. Before it is declared, export says how (exit 3)."""
    from vllm_fork.cli.main import main
    from vllm_fork.deploy.notes import make_notes

    mine = "our-tweak"
    lines = numbered("mine", 8)
    fork = make_fork(tmp_path, monkeypatch, {BASE: {"vllm/mine.py": text(lines)}}, default=BASE)
    spec = [PatchSpec("[Local] Our tweak", mine, "change", {"vllm/mine.py": {3: "mine tweaked"}})]
    with pytest.raises(ForkError) as info:
        fork.write_series(BASE, spec)
    assert info.value.exit_code == 3
    assert f"vllm-fork change add {mine} --title TEXT" in str(info.value)

    assert main(["change", "add", mine, "--title", "Our own tweak of mine.py"]) == 0
    assert "change our-tweak declared" in capsys.readouterr().out
    assert (fork.root / "local-changes.toml").read_text().startswith("[[change]]\n")
    assert main(["change", "add", mine, "--title", "again"]) == 3  # the id is taken
    assert registry.get(mine).local
    shutil.rmtree(tmp_path / f"author-{BASE}")
    fork.write_series(BASE, spec)
    names = [p.name for p in load_series(fork.series_dir(BASE)).patches]

    report = compute_status(fork.config, BASE)
    local = {c.change: c for c in report.changes}[mine]
    assert (local.state, local.patches) == ("carried", tuple(names))
    assert re.search(rf"^  {mine} +carried +a local change", format_status(report), re.M)
    matrix = compute_matrix(fork.config, [BASE], own=True, use_cache=False)
    assert matrix.rows[0].changes[mine].state == "carried"
    assert f"| {mine} | series | series applies |" in format_matrix(matrix)

    record = make_record(
        base=load_pins(fork.config.bases_file).get(BASE),
        series=load_series(fork.series_dir(BASE)),
        version=f"{BASE}+hardened.1",
        revision=1,
        mode="empty",
        device="cuda",
        tool_version=__version__,
    ).to_json()
    assert [p["change"] for p in record["series"]["patches"]] == [mine]
    notes = make_notes(record, wheel_name="w.whl", wheel_sha256="0" * 64)
    assert f"| {mine}: Our own tweak of mine.py | carried |" in notes
