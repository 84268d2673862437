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
from vllm_fork.diffs import touched_paths
from vllm_fork.errors import ForkError
from vllm_fork.facts import registry
from vllm_fork.facts.state import decide
from vllm_fork.probes import ABSENT, NA, PRESENT, UNPROBED, Finding, SourceTree, probe, probe_fn
from vllm_fork.reports import tables
from vllm_fork.reports.matrix import compute_matrix, format_matrix
from vllm_fork.reports.status import compute_status, format_status
from vllm_fork.series import store
from vllm_fork.series.patches import load_series
from vllm_fork.sources.pins import load_pins
from vllm_fork.sources.workspace import load_config
from vllm_fork.testing.forktests import is_test_module
from vllm_fork.wheel.provenance import format_record, make_record

from .rebase_support import PatchSpec, make_fork, numbered, text
from .test_series import patch_id_problems

ROOT = Path(__file__).resolve().parents[1]

# --------------------------------------------------------------------------- the documents


def test_document_tables_are_the_generated_ones() -> None:
    """README.md and docs/changes.md carry exactly the registry's tables
    (regenerate with `python -m vllm_fork.reports.tables --write`)."""
    assert tables.stale(load_config(root=ROOT, offline=True)) == []


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
    assert tables.stale(load_config(root=tmp_path, offline=True)) == [tables.README]
    assert tables.main(["--check", "--root", str(tmp_path)]) == 1
    assert tables.main(["--write", "--root", str(tmp_path)]) == 0
    assert tables.stale(load_config(root=tmp_path, offline=True)) == []


# --------------------------------------------------------------------------- registry vs series


def _series_versions() -> list[str]:
    return store.versions(ROOT / "series")


@pytest.mark.parametrize("version", _series_versions())
def test_registry_names_every_file_and_test_a_patch_touches(version: str) -> None:
    assert series_problems(ROOT, version) == []


def series_problems(root: Path, version: str) -> list[str]:
    """What the registry and docs/changes.md fail to name of the paths base
    ``version``'s patches touch in the repository at ``root``. A built-in change
    must name every code path its patches touch; a maintainer's own change
    (local-changes.toml) is data: its files are what export derived or the
    maintainer listed, not demanded here. Every change's test modules must be in
    docs/changes.md's table (generated from the series)."""
    series = load_series(root / "series" / version)
    support = {s.id: s for s in registry.SUPPORT}
    problems = []
    for patch, header in zip(series.patches, series.headers, strict=True):
        paths = touched_paths(patch.read_text(encoding="utf-8", errors="replace"))
        if header.change in support:
            prefixes = support[header.change].files
            if not all(p.startswith(prefixes) for p in paths):
                problems.append(f"{patch.name}: {paths} outside {prefixes}")
            continue
        change = registry.get(header.change)
        # a patch's test modules need no registry line: the docs' table of fork tests
        # reads them from the series (a backported fix brings its tests as data)
        tests = {p for p in paths if is_test_module(p)} - _documented_tests(root, change.id)
        if tests:
            problems.append(f"{patch.name}: tests not in docs/changes.md: {sorted(tests)}")
        code = {p for p in paths if not p.startswith("tests/")} - set(change.files_at(version))
        if code and not change.local:
            problems.append(f"{patch.name}: files not in the registry: {sorted(code)}")
    return problems


def _documented_tests(root: Path, change_id: str) -> set[str]:
    """The fork tests docs/changes.md lists for a change (its lifecycle table row)."""
    text = (root / "docs" / "changes.md").read_text()
    block = text[text.index("tables --write (lifecycle) -->") :]
    row = next((ln for ln in block.splitlines() if ln.startswith(f"| `{change_id}` |")), "")
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
        # a local change (no probe): n/a where it has no patch, not missing
        (UNPROBED, [], {}, "n/a"),
        (UNPROBED, ["hardening"], {}, "missing"),
        (UNPROBED, ["change"], {"patched": UNPROBED}, "carried"),
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
    releases = {BASE: {"vllm/mine.py": text(lines)}, NEWER: {"vllm/mine.py": text(lines)}}
    fork = make_fork(tmp_path, monkeypatch, releases, default=BASE)
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
    matrix = compute_matrix(fork.config, [BASE, NEWER], own=True, use_cache=False)
    assert matrix.rows[0].changes[mine].state == "carried"
    assert f"| {mine} | series | series applies |" in format_matrix(matrix)

    # a base it has no patch on: not applicable (never meant for it), not missing
    newer = {c.change: c for c in compute_status(fork.config, NEWER).changes}[mine]
    assert (newer.state, newer.reason) == ("n/a", "a local change with no patch on this base")
    assert matrix.rows[1].changes[mine].state == "n/a"
    assert tables.base_cell(registry.get(mine), NEWER, []) == "n/a"

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


# --------------------------------------------------------------------------- the documented flow


def _fresh_machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The environment of a machine with no git identity: an empty home, no global
    or system git configuration, and git told not to guess one."""
    home = tmp_path / "home"
    home.mkdir()
    for name in ("GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL", "GIT_COMMITTER_NAME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("GIT_COMMITTER_EMAIL", raising=False)
    monkeypatch.delenv("EMAIL", raising=False)
    env = {
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "GIT_CONFIG_GLOBAL": str(home / "no-gitconfig"),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_COUNT": "1",
        "GIT_CONFIG_KEY_0": "user.useConfigOnly",
        "GIT_CONFIG_VALUE_0": "true",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return env


def test_the_documented_local_change_flow_keeps_the_registry_checks_green(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/changes.md's local-change flow, on a machine with no git identity:
    `change add` (no --files/--tests), a plain `git commit` in a materialized tree
    with the trailers `change add` printed, `export`, the tables regenerated. The
    entry then names what its patch touches (derived by export), and the checks
    the test command runs on the repository hold on the result: the registry/series
    check, the patch ids (test_series.py), the document tables, the entries."""
    import subprocess

    from vllm_fork.cli.main import main

    mine = "banner-log"
    fork = make_fork(tmp_path, monkeypatch, {BASE: {"vllm/version.py": "name = 'vllm'\n"}}, BASE)
    for name in (tables.README, tables.CHANGES_DOC):
        (fork.root / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / name, fork.root / name)
    _fresh_machine(tmp_path, monkeypatch)
    monkeypatch.chdir(fork.root)

    # 1. declare
    assert main(["change", "add", mine, "--title", "Name the fork in vllm/version.py"]) == 0
    printed = capsys.readouterr().out
    trailers = re.findall(r"^  ([A-Z][A-Za-z-]+: \S.*)$", printed, re.M)
    assert trailers, printed
    # 2. materialize, commit with the printed trailers (plain git: the tree's identity)
    tree = tmp_path / "work"
    assert main(["materialize", str(tree)]) == 0
    (tree / "vllm" / "version.py").write_text("name = 'vllm (hardened fork)'\n")
    (tree / "tests").mkdir()
    (tree / "tests" / "test_banner_log.py").write_text(
        "def test_banner():\n    from vllm.version import name\n\n    assert 'fork' in name\n"
    )
    message = "[Local] Name the fork in the version banner\n\nOperators see the build.\n\n"
    for args in (["add", "-A"], ["commit", "-q", "-m", message + "\n".join(trailers)]):
        proc = subprocess.run(["git", *args], cwd=tree, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
    # 3. export
    assert main(["export", str(tree)]) == 0
    out = capsys.readouterr().out
    assert f"{mine}: files += vllm/version.py; tests += tests/test_banner_log.py" in out
    entry = registry.get(mine)
    assert entry.files_at(BASE) == ("vllm/version.py",)
    assert entry.tests == ("tests/test_banner_log.py",)
    # 4. the tables name the new change
    assert tables.main(["--write", "--root", str(fork.root)]) == 0

    # what the test command checks of the repository holds
    assert series_problems(fork.root, BASE) == []
    assert patch_id_problems(fork.root) == []  # the printed trailers name the patch
    assert tables.stale(load_config(root=fork.root, offline=True)) == []
    test_registry_entries_are_complete()
    report = compute_status(load_config(root=fork.root, offline=True), BASE)
    assert {c.change: c.state for c in report.changes}[mine] == "carried"


def test_change_add_records_the_files_and_tests_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--files/--tests (repeatable) land in the entry; a --tests path that is no
    fork test module is a refused request (exit 2) and writes nothing."""
    from vllm_fork.cli.main import main

    fork = make_fork(tmp_path, monkeypatch, {BASE: {"vllm/mine.py": "x = 1\n"}}, BASE)
    local = fork.root / registry.LOCAL_FILE
    bad = ["change", "add", "mine", "--title", "T", "--tests", "vllm/mine.py"]
    assert main(bad) == 2
    assert not local.exists()
    argv = ["change", "add", "mine", "--title", "T", "--files", "vllm/mine.py"]
    argv += ["--tests", "tests/a/test_one.py", "--tests", "tests/a/test_two.py"]
    assert main(argv) == 0
    change = registry.get("mine")
    assert change.files_at(BASE) == ("vllm/mine.py",)
    assert change.tests == ("tests/a/test_one.py", "tests/a/test_two.py")
