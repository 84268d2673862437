"""The provenance record, `verify` on good and tampered wheels, and wheel diffs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_fork import __version__
from vllm_fork.cli.main import main
from vllm_fork.series.patches import load_series
from vllm_fork.sources.pins import load_pins
from vllm_fork.wheel.provenance import PACKAGE_PATH, Provenance, dumps, format_record, make_record
from vllm_fork.wheel.verify import verify_wheel
from vllm_fork.wheel.wheelfile import Wheel, diff_wheels

from .buildutil import (
    FULL_PATCH,
    csrc_patch,
    full_csrc_patch,
    make_series,
    pin_upstream_wheel,
    python_patch,
)
from .buildutil import fork_wheel as build_fork_wheel
from .conftest import FAKE_VERSION, ForkRepo, sha256_of
from .seriesutil import edit_stored, stored_patch
from .wheelutil import replace_member, write_wheel

VERSION = f"{FAKE_VERSION}+hardened.1"
TAG = "cp38-abi3-manylinux_2_28_x86_64"


def record_for(repo: ForkRepo, mode: str = "precompiled", version: str = VERSION) -> dict:
    """The record's JSON object, as the build writes it."""
    return typed_record(repo, mode, version).to_json()


def typed_record(repo: ForkRepo, mode: str = "precompiled", version: str = VERSION) -> Provenance:
    base = load_pins(repo.config.bases_file).get(FAKE_VERSION)
    series = load_series(repo.series_dir())
    return make_record(
        base=base,
        series=series,
        version=version,
        revision=1,
        mode=mode,
        device="cuda",
        tool_version=__version__,
    )


def fork_wheel(
    directory: Path, record: dict, version: str = VERSION, tree: Path | None = None
) -> Path:
    """A precompiled fork wheel of the series made by ``series_repo``, whose tree is
    ``tree`` (default: ``directory/wt``, where the fixture puts it)."""
    return build_fork_wheel(directory, record, tree or directory / "wt", version)


@pytest.fixture
def series_repo(fork_repo: ForkRepo, tmp_path: Path) -> ForkRepo:
    pin_upstream_wheel(fork_repo, tmp_path / "upstream")
    make_series(fork_repo, tmp_path, python_patch)
    return fork_repo


def test_record_content(series_repo: ForkRepo) -> None:
    record = record_for(series_repo)
    patch = stored_patch(series_repo.series_dir(), "0001-ROCm-Change-f3.patch")
    assert record["version"] == VERSION
    assert record["base"]["sdist"]["sha256"] == sha256_of(series_repo.sdist)
    wheel_pin = load_pins(series_repo.config.bases_file).get(FAKE_VERSION).wheel
    assert record["base"]["upstream_wheel"] == {
        "filename": wheel_pin.filename,
        "sha256": wheel_pin.sha256,
    }
    assert record["build"] == {"mode": "precompiled", "device": "cuda"}
    assert record["tool"] == {"name": "vllm-fork", "version": __version__}
    assert record["series"]["patches"] == [
        {
            "file": "0001-ROCm-Change-f3.patch",
            "change": "ar-rms-pack-gate",
            "part": "change",
            "origin": "backport, https://github.com/vllm-project/vllm/pull/42409",
            "upstream_pr": "https://github.com/vllm-project/vllm/pull/42409",
            "sha256": sha256_of(patch),
            "paths": ["vllm/layer.py"],
            "build": "any",
        }
    ]
    assert record["series"]["left_out"] == []
    # no upstream wheel in a build that does not reuse its binaries
    assert record_for(series_repo, mode="full")["base"]["upstream_wheel"] is None
    assert dumps(record) == dumps(record_for(series_repo))  # stable bytes
    typed = typed_record(series_repo)
    assert dumps(typed) == dumps(record)  # the dataclass writes the same JSON
    assert Provenance.from_json(record) == typed  # and reads it back
    assert typed.patches[0].paths == ("vllm/layer.py",) and typed.upstream_wheel is not None
    assert "0001-ROCm-Change-f3.patch" in format_record(typed)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda r: r.update(schema=2), "schema 1"),
        (lambda r: r.pop("version"), "version is not a string"),
        (lambda r: r["series"].update(patches={}), "series.patches is not a list"),
        (lambda r: r["series"]["patches"][0].pop("sha256"), r"patches\[0\]\.sha256"),
        (lambda r: r["base"].pop("sdist"), "base.sdist is not a table"),
    ],
)
def test_malformed_record_is_refused(series_repo: ForkRepo, tmp_path: Path, edit, message) -> None:
    record = record_for(series_repo)
    edit(record)
    with pytest.raises(ValueError, match=message):
        Provenance.from_json(record)
    report = verify_wheel(series_repo.config, fork_wheel(tmp_path, record))
    assert not report.passed and report.bad[-1].startswith("provenance: "), report.bad


def test_verify_good_wheel_passes(series_repo: ForkRepo, tmp_path: Path) -> None:
    wheel = fork_wheel(tmp_path, record_for(series_repo))
    report = verify_wheel(series_repo.config, wheel)
    assert report.passed, report.format()
    assert main(["verify", str(wheel)]) == 0


def test_verify_tampered_file_fails(
    series_repo: ForkRepo, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = fork_wheel(tmp_path, record_for(series_repo))
    (tmp_path / "bad").mkdir()
    bad = replace_member(
        good, tmp_path / "bad" / good.name, "vllm/layer.py", b"def f3(x):\n    return x + 3\n"
    )
    assert main(["verify", str(bad)]) == 1
    out = capsys.readouterr().out
    assert "MISMATCH  vllm/layer.py: content does not match its RECORD hash" in out
    assert out.rstrip().endswith("verify: FAILED (1)")


def test_verify_unlisted_member_fails(series_repo: ForkRepo, tmp_path: Path) -> None:
    import zipfile

    wheel = fork_wheel(tmp_path, record_for(series_repo))
    with zipfile.ZipFile(wheel, "a") as zf:
        zf.writestr("vllm/extra.py", b"print('hi')\n")
    report = verify_wheel(series_repo.config, wheel)
    assert any("vllm/extra.py: in the wheel but not in RECORD" in b for b in report.bad)


def test_verify_series_drift_fails(series_repo: ForkRepo, tmp_path: Path) -> None:
    wheel = fork_wheel(tmp_path, record_for(series_repo))
    edit_stored(
        series_repo.series_dir(),
        "0001-ROCm-Change-f3.patch",
        lambda data: data.replace(b"return x + 33", b"return x + 34"),
    )
    report = verify_wheel(series_repo.config, wheel)
    assert report.bad == ["patch 0001-ROCm-Change-f3.patch: differs from the series in sha256"]


def test_verify_pin_and_version_mismatch(series_repo: ForkRepo, tmp_path: Path) -> None:
    record = record_for(series_repo)
    record["base"]["sdist"]["sha256"] = "0" * 64
    other = f"{FAKE_VERSION}+hardened.5"
    record["version"] = other
    wheel = fork_wheel(tmp_path, record, version=VERSION)
    bad = verify_wheel(series_repo.config, wheel).bad
    assert any(b.startswith("sdist vllm-9.9.9.tar.gz sha256 matches bases.toml") for b in bad)
    assert any(b.startswith(f"version {other} in file name") for b in bad)
    assert any(b.startswith("version label matches series revision 1") for b in bad)


def test_verify_wheel_without_record_fails(series_repo: ForkRepo, tmp_path: Path) -> None:
    wheel = write_wheel(
        tmp_path / f"vllm-{VERSION}-{TAG}.whl", {"vllm/__init__.py": b""}, VERSION, TAG
    )
    report = verify_wheel(series_repo.config, wheel)
    assert report.bad == [f"provenance: {PACKAGE_PATH} is missing: not a fork build"]


def test_verify_new_patch_in_series_fails(series_repo: ForkRepo, tmp_path: Path) -> None:
    wheel = fork_wheel(tmp_path, record_for(series_repo))
    make_series(series_repo, tmp_path / "again", csrc_patch)
    bad = verify_wheel(series_repo.config, wheel).bad
    assert any(b.startswith("series patches: wheel has") for b in bad)


def test_diff_wheels(tmp_path: Path) -> None:
    a = write_wheel(
        tmp_path / f"vllm-1.0-{TAG}.whl",
        {"vllm/a.py": b"a", "vllm/b.py": b"b", "vllm/x.so": b"1"},
        "1.0",
        TAG,
    )
    (tmp_path / "2").mkdir()
    b = write_wheel(
        tmp_path / "2" / f"vllm-1.0-{TAG}.whl",
        {"vllm/a.py": b"a", "vllm/b.py": b"B", "vllm/c.py": b"c", "vllm/x.so": b"2"},
        "1.0",
        TAG,
    )
    d = diff_wheels(a, b)
    assert (d.only_first, d.only_second, d.differ) == (
        [],
        ["vllm/c.py"],
        ["vllm/b.py", "vllm/x.so"],
    )
    assert diff_wheels(a, b, python_only=True).differ == ["vllm/b.py"]
    assert diff_wheels(a, a).same
    with Wheel(a) as w:
        assert w.metadata_version == "1.0" and w.wheel_tags == [TAG]


def test_provenance_module_reads_installed_record(tmp_path: Path) -> None:
    pkg = tmp_path / "site" / "vllm"
    pkg.mkdir(parents=True)
    # importing vllm would fail: the record must be found without importing it
    (pkg / "__init__.py").write_text("raise ImportError('must not be imported')\n")
    record = {
        "schema": 1,
        "version": "1.0+hardened.0",
        "tool": {"version": "0"},
        "base": {
            "version": "1.0",
            "sdist": {"filename": "s", "sha256": "0"},
            "upstream_wheel": None,
        },
        "build": {"mode": "empty", "device": "cuda"},
        "series": {"revision": 0, "patches": []},
    }
    (pkg / "_fork_provenance.json").write_text(json.dumps(record))
    src = Path(__file__).resolve().parents[1] / "src"
    env = {"PYTHONPATH": f"{tmp_path / 'site'}:{src}", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run(
        [sys.executable, "-m", "vllm_fork.provenance", "--json"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == record
    (pkg / "_fork_provenance.json").unlink()
    proc = subprocess.run(
        [sys.executable, "-m", "vllm_fork.provenance"], capture_output=True, text=True, env=env
    )
    assert proc.returncode == 1 and "no fork provenance" in proc.stderr


def test_verify_malformed_record_fails_cleanly(series_repo: ForkRepo, tmp_path: Path) -> None:
    record = record_for(series_repo)
    del record["build"]
    report = verify_wheel(series_repo.config, fork_wheel(tmp_path, record))
    assert not report.passed
    assert report.bad[-1].startswith("provenance: malformed record")


# --------------------------------------------------------------------------- Fork-Build: full

NOFULL = f"{FAKE_VERSION}+hardened.2.nofull"


@pytest.fixture
def marked_repo(fork_repo: ForkRepo, tmp_path: Path) -> ForkRepo:
    pin_upstream_wheel(fork_repo, tmp_path / "upstream")
    make_series(fork_repo, tmp_path, python_patch, full_csrc_patch)
    return fork_repo


def marked_record(repo: ForkRepo, version: str, left_out: tuple[str, ...], mode: str) -> dict:
    return make_record(
        base=load_pins(repo.config.bases_file).get(FAKE_VERSION),
        series=load_series(repo.series_dir()),
        version=version,
        revision=2,
        mode=mode,
        device="cuda",
        tool_version=__version__,
        left_out=left_out,
    )


def test_record_lists_the_left_out_patch(marked_repo: ForkRepo) -> None:
    record = marked_record(marked_repo, NOFULL, (FULL_PATCH,), "precompiled")
    data = record.to_json()
    assert [p["file"] for p in data["series"]["patches"]] == ["0001-ROCm-Change-f3.patch"]
    [out] = data["series"]["left_out"]
    assert (out["file"], out["change"], out["build"]) == (FULL_PATCH, "rope-fast-kernel", "full")
    assert out["sha256"] == sha256_of(stored_patch(marked_repo.series_dir(), FULL_PATCH))
    assert f"left out: {FULL_PATCH}  [rope-fast-kernel]" in format_record(record)
    assert Provenance.from_json(data) == record  # the left-out list reads back
    # a full build has every patch and records which ones need it
    full = marked_record(marked_repo, f"{FAKE_VERSION}+hardened.2", (), "full").to_json()
    assert [p["build"] for p in full["series"]["patches"]] == ["any", "full"]
    assert full["series"]["left_out"] == []


def test_verify_precompiled_wheel_without_the_full_patch(
    marked_repo: ForkRepo, tmp_path: Path
) -> None:
    wheel = fork_wheel(
        tmp_path, marked_record(marked_repo, NOFULL, (FULL_PATCH,), "precompiled"), NOFULL
    )
    report = verify_wheel(marked_repo.config, wheel)
    assert report.passed, report.format()
    assert any(
        f"left-out patches: {FULL_PATCH} (rope-fast-kernel, not in this build)" in line
        for line in report.ok
    )


def test_verify_rejects_a_label_claiming_the_left_out_patch(
    marked_repo: ForkRepo, tmp_path: Path
) -> None:
    plain = f"{FAKE_VERSION}+hardened.2"
    record = marked_record(marked_repo, plain, (FULL_PATCH,), "precompiled")
    report = verify_wheel(marked_repo.config, fork_wheel(tmp_path, record, plain))
    assert not report.passed
    assert any(
        f"wheel is {plain}, but its provenance left out {FULL_PATCH}" in line for line in report.bad
    ), report.format()


def test_verify_rejects_a_precompiled_wheel_claiming_every_patch(
    marked_repo: ForkRepo, tmp_path: Path
) -> None:
    """A precompiled wheel cannot carry the marked patch, whatever its record says."""
    plain = f"{FAKE_VERSION}+hardened.2"
    record = marked_record(marked_repo, plain, (), "precompiled")
    report = verify_wheel(marked_repo.config, fork_wheel(tmp_path, record, plain))
    assert not report.passed
    text = "\n".join(report.bad)
    assert f"the current series gives {NOFULL}" in text
    assert f"a precompiled build of the series leaves out ['{FULL_PATCH}']" in text
