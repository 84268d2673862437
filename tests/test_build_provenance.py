"""The provenance record, `verify` on good and tampered wheels, and wheel diffs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_fork import __version__
from vllm_fork.build.verify import verify_wheel
from vllm_fork.build.wheelfile import Wheel, diff_wheels
from vllm_fork.cli.main import main
from vllm_fork.provenance import PACKAGE_PATH, dumps, format_record, make_record
from vllm_fork.series.patches import load_series
from vllm_fork.sources.pins import load_pins

from .buildutil import WHEEL_PIN, csrc_patch, make_series, pin_wheel, python_patch
from .conftest import FAKE_VERSION, ForkRepo, sha256_of
from .wheelutil import replace_member, version_py, write_wheel

VERSION = f"{FAKE_VERSION}+hardened.1"
TAG = "cp38-abi3-manylinux_2_28_x86_64"


def record_for(repo: ForkRepo, mode: str = "precompiled", version: str = VERSION) -> dict:
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


def fork_wheel(directory: Path, record: dict, version: str = VERSION) -> Path:
    files = {
        "vllm/__init__.py": b"from .version import __version__\n",
        "vllm/_version.py": version_py(version),
        "vllm/layer.py": b"def f3(x):\n    return x + 33\n",
        PACKAGE_PATH: dumps(record).encode(),
    }
    return write_wheel(directory / f"vllm-{version}-{TAG}.whl", files, version, TAG)


@pytest.fixture
def series_repo(fork_repo: ForkRepo, tmp_path: Path) -> ForkRepo:
    pin_wheel(fork_repo)
    make_series(fork_repo, tmp_path, python_patch)
    return fork_repo


def test_record_content(series_repo: ForkRepo) -> None:
    record = record_for(series_repo)
    patch = series_repo.series_dir() / "0001-ROCm-Change-f3.patch"
    assert record["version"] == VERSION
    assert record["base"]["sdist"]["sha256"] == sha256_of(series_repo.sdist)
    assert record["base"]["upstream_wheel"] == {
        "filename": WHEEL_PIN.filename,
        "sha256": WHEEL_PIN.sha256,
    }
    assert record["build"] == {"mode": "precompiled", "device": "cuda"}
    assert record["tool"] == {"name": "vllm-fork", "version": __version__}
    assert record["series"]["patches"] == [
        {
            "file": patch.name,
            "change": "ar-rms-pack-gate",
            "part": "change",
            "origin": "backport, https://github.com/vllm-project/vllm/pull/42409",
            "upstream_pr": "https://github.com/vllm-project/vllm/pull/42409",
            "sha256": sha256_of(patch),
            "paths": ["vllm/layer.py"],
        }
    ]
    # no upstream wheel in a build that does not reuse its binaries
    assert record_for(series_repo, mode="full")["base"]["upstream_wheel"] is None
    assert dumps(record) == dumps(record_for(series_repo))  # stable bytes
    assert "0001-ROCm-Change-f3.patch" in format_record(record)


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
    assert "MISMATCH  RECORD hashes of all files: vllm/layer.py: content does not match" in out
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
    patch = series_repo.series_dir() / "0001-ROCm-Change-f3.patch"
    patch.write_text(patch.read_text().replace("return x + 33", "return x + 34"))
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
