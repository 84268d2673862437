"""`vllm-fork audit`: every member that differs from upstream's wheel is explained."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vllm_fork import __version__
from vllm_fork.cli.main import main
from vllm_fork.series.patches import load_series
from vllm_fork.sources.pins import load_pins
from vllm_fork.tree.materialize import materialize
from vllm_fork.wheel.audit import AuditError, align_with_upstream_wheel, audit_wheel
from vllm_fork.wheel.provenance import PACKAGE_PATH, make_record
from vllm_fork.wheel.verify import verify_wheel

from .buildutil import (
    FULL_PATCH,
    csrc_patch,
    fork_wheel,
    full_csrc_patch,
    make_series,
    pin_upstream_wheel,
    python_patch,
)
from .conftest import FAKE_FILES, FAKE_VERSION, ForkRepo
from .gitutil import git

VERSION = f"{FAKE_VERSION}+hardened.1"
# upstream's wheel was built from other sources than its sdist for this file
NEWER_INIT = b'__version__ = "9.9.9"\nNEWER = True\n'


def record(repo: ForkRepo, mode: str = "precompiled", **base_extra: object) -> dict:
    rec = make_record(
        base=load_pins(repo.config.bases_file).get(FAKE_VERSION),
        series=load_series(repo.series_dir()),
        version=VERSION,
        revision=1,
        mode=mode,
        device="cuda",
        tool_version=__version__,
    ).to_json()
    rec["base"].update(base_extra)
    return rec


@pytest.fixture
def audited(fork_repo: ForkRepo, tmp_path: Path) -> tuple[ForkRepo, Path]:
    """Base 9.9.9 whose upstream wheel disagrees with its sdist on vllm/__init__.py,
    a one-patch series changing vllm/layer.py, and its materialized tree."""
    pin_upstream_wheel(fork_repo, tmp_path / "up", {"vllm/__init__.py": NEWER_INIT})
    tree = make_series(fork_repo, tmp_path, python_patch)
    return fork_repo, tree


def by_path(report) -> dict[str, object]:
    return {m.path: m for m in report.members}


def test_good_wheel_every_member_explained(audited, tmp_path: Path) -> None:
    repo, tree = audited
    wheel = fork_wheel(
        tmp_path / "w", record(repo), tree, VERSION, {"vllm/__init__.py": NEWER_INIT}
    )
    report = audit_wheel(repo.config, wheel)
    assert report.passed, report.format()
    members = by_path(report)
    assert set(members) == {
        "vllm/layer.py",
        "vllm/_version.py",
        PACKAGE_PATH,
        "{dist-info}/METADATA",
    }
    assert members["vllm/layer.py"].explanation == (
        "patched by 0001-ROCm-Change-f3.patch (ar-rms-pack-gate)"
    )
    assert members[PACKAGE_PATH].state == "added"
    # the file on which upstream's sdist and wheel disagree: the fork ships the wheel's
    assert report.disagreements == [("vllm/__init__.py", "upstream wheel's version")]
    assert report.compared == 8


def test_stray_change_fails_naming_it(audited, tmp_path: Path) -> None:
    repo, tree = audited
    wheel = fork_wheel(
        tmp_path / "w",
        record(repo),
        tree,
        VERSION,
        {"vllm/__init__.py": NEWER_INIT, "vllm/_C.abi3.so": b"\x7fELF rebuilt\n"},
    )
    report = audit_wheel(repo.config, wheel)
    assert not report.passed
    [stray] = report.unexplained
    assert (stray.path, stray.state) == ("vllm/_C.abi3.so", "changed")
    assert "no series patch changes this file" in stray.detail
    assert "UNEXPLAINED" in report.format()


def test_added_file_fails(audited, tmp_path: Path) -> None:
    repo, tree = audited
    wheel = fork_wheel(
        tmp_path / "w",
        record(repo),
        tree,
        VERSION,
        {"vllm/__init__.py": NEWER_INIT, "vllm/stray.py": b"print('hi')\n"},
    )
    [stray] = audit_wheel(repo.config, wheel).unexplained
    assert (stray.path, stray.state) == ("vllm/stray.py", "added")


def test_extra_edit_to_a_patched_file_fails(audited, tmp_path: Path) -> None:
    repo, tree = audited
    patched = git(tree, "show", "fork:vllm/layer.py").encode()
    wheel = fork_wheel(
        tmp_path / "w",
        record(repo),
        tree,
        VERSION,
        {"vllm/__init__.py": NEWER_INIT, "vllm/layer.py": patched + b"# edited after\n"},
    )
    [bad] = audit_wheel(repo.config, wheel).unexplained
    assert bad.path == "vllm/layer.py"
    assert "0001-ROCm-Change-f3.patch" in bad.detail
    assert "differ from the tree materialized" in bad.detail


def test_sdist_version_of_a_disagreeing_file_is_flagged(audited, tmp_path: Path) -> None:
    """A wheel that ships the sdist's version where upstream's wheel differs fails."""
    repo, tree = audited
    sdist_init = FAKE_FILES["vllm/__init__.py"].encode()
    wheel = fork_wheel(
        tmp_path / "w", record(repo), tree, VERSION, {"vllm/__init__.py": sdist_init}
    )
    report = audit_wheel(repo.config, wheel)
    assert [m.path for m in report.unexplained] == ["vllm/__init__.py"]
    assert report.disagreements == [("vllm/__init__.py", "the sdist's version")]


def test_build_tree_edit_is_not_taken_as_the_series(audited, tmp_path: Path) -> None:
    """Passing the build tree itself must not make an uncommitted edit look patched."""
    repo, tree = audited
    (tree / "vllm/layer.py").write_text("# edited in the build tree\n")
    wheel = fork_wheel(
        tmp_path / "w",
        record(repo),
        tree,
        VERSION,
        {"vllm/__init__.py": NEWER_INIT, "vllm/layer.py": b"# edited in the build tree\n"},
    )
    [bad] = audit_wheel(repo.config, wheel, tree=tree).unexplained
    assert bad.path == "vllm/layer.py"


def test_full_build_compiled_members(fork_repo: ForkRepo, tmp_path: Path) -> None:
    pin_upstream_wheel(fork_repo, tmp_path / "up")
    tree = make_series(fork_repo, tmp_path, python_patch, csrc_patch)
    rebuilt = {"vllm/_C.abi3.so": b"\x7fELF rebuilt\n"}
    wheel = fork_wheel(tmp_path / "w", record(fork_repo, "full"), tree, VERSION, rebuilt)
    report = audit_wheel(fork_repo.config, wheel)
    assert report.passed, report.format()
    so = by_path(report)["vllm/_C.abi3.so"]
    assert so.explanation == (
        "rebuilt, with 0002-Kernel-Read-the-cache-in-its-own-dtype.patch (rope-cache-dtype)"
    )


def test_full_build_without_compiled_patch(fork_repo: ForkRepo, tmp_path: Path) -> None:
    pin_upstream_wheel(fork_repo, tmp_path / "up")
    tree = make_series(fork_repo, tmp_path, python_patch)
    rebuilt = {"vllm/_C.abi3.so": b"\x7fELF rebuilt\n"}
    wheel = fork_wheel(tmp_path / "w", record(fork_repo, "full"), tree, VERSION, rebuilt)
    so = by_path(audit_wheel(fork_repo.config, wheel))["vllm/_C.abi3.so"]
    assert so.explanation == "rebuilt by the full build (no patch changes its sources)"
    # the same member in a precompiled build is not explained at all
    wheel = fork_wheel(tmp_path / "p", record(fork_repo), tree, VERSION, rebuilt)
    assert [m.path for m in audit_wheel(fork_repo.config, wheel).unexplained] == ["vllm/_C.abi3.so"]


def test_align_ships_the_wheel_version(audited, tmp_path: Path) -> None:
    repo, _ = audited
    build_tree = tmp_path / "build-tree"
    materialize(repo.config, None, build_tree)
    base = load_pins(repo.config.bases_file).get(FAKE_VERSION)
    assert align_with_upstream_wheel(repo.config, build_tree, base) == ["vllm/__init__.py"]
    assert (build_tree / "vllm/__init__.py").read_bytes() == NEWER_INIT
    # staged for setuptools-scm, not committed: the fork branch is still the series
    assert git(build_tree, "diff", "--cached", "--name-only").split() == ["vllm/__init__.py"]
    assert git(build_tree, "show", "fork:vllm/__init__.py") == FAKE_FILES["vllm/__init__.py"]


def test_align_refuses_a_patch_of_a_disagreeing_file(fork_repo: ForkRepo, tmp_path: Path) -> None:
    pin_upstream_wheel(fork_repo, tmp_path / "up", {"vllm/layer.py": b"# newer layer\n"})
    make_series(fork_repo, tmp_path, python_patch)
    build_tree = tmp_path / "build-tree"
    materialize(fork_repo.config, None, build_tree)
    base = load_pins(fork_repo.config.bases_file).get(FAKE_VERSION)
    with pytest.raises(AuditError, match=r"vllm/layer.py \(changed by 0001-ROCm-Change-f3"):
        align_with_upstream_wheel(fork_repo.config, build_tree, base)


def test_verify_runs_the_audit(audited, tmp_path: Path) -> None:
    repo, tree = audited
    good = fork_wheel(tmp_path / "g", record(repo), tree, VERSION, {"vllm/__init__.py": NEWER_INIT})
    report = verify_wheel(repo.config, good)
    assert report.passed, report.format()
    assert any(line.startswith("delta against") for line in report.ok)
    stray = fork_wheel(
        tmp_path / "s",
        record(repo),
        tree,
        VERSION,
        {"vllm/__init__.py": NEWER_INIT, "vllm/stray.py": b"x = 1\n"},
    )
    report = verify_wheel(repo.config, stray)
    assert not report.passed
    assert "vllm/stray.py (added" in report.bad[-1]


def test_cli_audit_json(audited, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    repo, tree = audited
    stray = fork_wheel(
        tmp_path / "s",
        record(repo),
        tree,
        VERSION,
        {"vllm/__init__.py": NEWER_INIT, "vllm/stray.py": b"x = 1\n"},
    )
    assert main(["audit", "--json", str(stray)]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["passed"] is False
    assert [m["path"] for m in out["members"] if not m["explained"]] == ["vllm/stray.py"]
    assert out["sdist_wheel_disagreements"] == [
        {"path": "vllm/__init__.py", "fork_ships": "upstream wheel's version"}
    ]


def test_audit_uses_the_patch_set_of_the_build(fork_repo: ForkRepo, tmp_path: Path) -> None:
    """A precompiled build leaves out a Fork-Build: full patch: the audit compares with
    base + series less that patch, so the left-out patch's Python part is not in it."""
    pin_upstream_wheel(fork_repo, tmp_path / "up")
    extra = "EXTRA = 2\n"
    tree = make_series(fork_repo, tmp_path, python_patch, lambda t: full_csrc_patch(t, extra))
    nofull = f"{FAKE_VERSION}+hardened.2.nofull"
    rec = make_record(
        base=load_pins(fork_repo.config.bases_file).get(FAKE_VERSION),
        series=load_series(fork_repo.series_dir()),
        version=nofull,
        revision=2,
        mode="precompiled",
        device="cuda",
        tool_version=__version__,
        left_out=(FULL_PATCH,),
    )
    # what the build makes: the wheel lacks the left-out patch entirely
    good = fork_wheel(tmp_path / "g", rec, tree, nofull, {"vllm/extra.py": None})
    report = audit_wheel(fork_repo.config, good)
    assert report.passed, report.format()
    assert "vllm/extra.py" not in by_path(report)
    # a wheel that says it lacks the patch but ships its Python part is caught
    bad = fork_wheel(tmp_path / "b", rec, tree, nofull)
    [stray] = audit_wheel(fork_repo.config, bad).unexplained
    assert (stray.path, stray.state) == ("vllm/extra.py", "added")
