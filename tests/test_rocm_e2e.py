"""End to end: the hardened ROCm wheel of the default base, from a synthetic upstream
ROCm wheel served by a local index.

pin (`--rocm-index http://127.0.0.1:PORT/simple/`) -> `build --device rocm` (the real
base and series, through vLLM's own setup.py) -> verify -> audit -> publish
(pypiserver) -> pip install into a Python 3.12 venv -> smoke of the installed files.

The synthetic wheel (tests/rocmwheel.py) has the layout of upstream's ROCm wheel;
no real one can be fetched here. It runs with the other end-to-end tests
(a release test: `vllm-fork release-check` runs it with the default base, with
VLLM_FORK_RELEASE_TESTS=1 and VLLM_FORK_E2E_BUILD=1): it needs the base's sdist
and upstream wheel (cached by `vllm-fork fetch --wheel`) and, once, a small build
environment with a CPU torch.
The pins go into a copy of bases.toml (VLLM_FORK_ROOT): the repository is not edited.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from vllm_fork.facts.names import tag_for
from vllm_fork.probes import GitTree
from vllm_fork.probes.rocm_pins import aiter_pin
from vllm_fork.sources.pins import load_pins, save_pins
from vllm_fork.sources.workspace import load_config
from vllm_fork.wheel.provenance import PACKAGE_PATH, loads
from vllm_fork.wheel.wheelfile import Wheel

from .indexserver import PASSWORD, USER, IndexServer, index_server
from .rocmwheel import ROCM_TAG, make_rocm_wheel, serve, sha256_of, stand_in_binary, write_index

pytestmark = [
    pytest.mark.release,  # run by `vllm-fork release-check`, not the test command
    pytest.mark.slow,
    pytest.mark.network,
    pytest.mark.skipif(
        os.environ.get("VLLM_FORK_E2E_BUILD") != "1",
        reason="set VLLM_FORK_E2E_BUILD=1 to build the default base's ROCm wheel for real",
    ),
]

REPO = Path(__file__).resolve().parents[1]


def python312() -> str | None:
    """A working CPython 3.12 (the Python upstream's ROCm wheels are for), or None."""
    candidates = [os.environ.get("VLLM_FORK_PY312"), shutil.which("python3.12")]
    candidates += sorted(str(p) for p in Path.home().glob(".pyenv/versions/3.12*/bin/python3.12"))
    for c in candidates:
        if c and subprocess.run([c, "-c", "import venv"], capture_output=True).returncode == 0:
            return c
    return None


def say(text: str) -> None:
    print(text, flush=True)


@pytest.fixture
def fork_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """bases.toml, known-issues.toml and series/ of the repository, copied: the pin
    goes there (the series' Fork-Fixes trailers name entries of the register)."""
    root = tmp_path / "repo"
    root.mkdir()
    shutil.copyfile(REPO / "bases.toml", root / "bases.toml")
    shutil.copyfile(REPO / "known-issues.toml", root / "known-issues.toml")
    shutil.copytree(REPO / "series", root / "series")
    monkeypatch.setenv("VLLM_FORK_ROOT", str(root))
    return root


@pytest.fixture
def rocm_index(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """(simple URL, wheel) of the synthetic ROCm wheel of the default base on 127.0.0.1."""
    config = load_config(root=REPO)
    version = config.base(None).version
    t0 = time.monotonic()
    wheel = make_rocm_wheel(config, version, tmp_path / "synthetic")
    say(f"synthetic {wheel.name}: {time.monotonic() - t0:.1f} s")
    write_index(tmp_path / "rocm-index", [wheel])
    server, url = serve(tmp_path / "rocm-index")
    try:
        yield url, wheel
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def upload(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[IndexServer]:
    monkeypatch.setenv("TWINE_USERNAME", USER)
    monkeypatch.setenv("TWINE_PASSWORD", PASSWORD)
    with index_server(tmp_path / "upload") as srv:
        yield srv


def cli(*argv: str) -> subprocess.CompletedProcess[str]:
    say("$ vllm-fork " + " ".join(argv))
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "vllm_fork", *argv], capture_output=True, text=True, cwd=REPO
    )
    say(f"  exit {proc.returncode} in {time.monotonic() - t0:.1f} s")
    return proc


def test_pin_build_verify_audit_publish_install_smoke(
    fork_copy: Path,
    rocm_index: tuple[str, Path],
    upload: IndexServer,
    tmp_path: Path,
) -> None:
    start = time.monotonic()
    url, synthetic = rocm_index
    config = load_config(root=fork_copy)
    version = config.base(None).version

    proc = cli("pin", version, "--rocm-index", url)
    assert proc.returncode == 0, proc.stderr
    pin = load_config(root=fork_copy).base(version).rocm_pin(None)
    assert (pin.filename, pin.sha256, pin.rocm, pin.python) == (
        synthetic.name,
        sha256_of(synthetic),
        "7.0.0",
        "cp312",
    )

    out = tmp_path / "dist"
    proc = cli("build", "--device", "rocm", "-o", str(out), "--json")
    say(proc.stderr[-2000:])
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    wheel = Path(result["wheel"])
    assert result["device"] == "rocm" and ".rocm700" in result["version"]
    assert "cpu" not in result["version"]
    assert wheel.name == f"vllm-{result['version']}-{ROCM_TAG}.whl"  # upstream's tags

    with Wheel(wheel) as w, Wheel(synthetic) as up:
        record = loads(w.read(PACKAGE_PATH))
        # the binaries are the pinned wheel's, copied by vLLM's precompiled path
        for name in ("vllm/_rocm_C.abi3.so", "vllm/_C.abi3.so", "vllm/_moe_C.abi3.so"):
            assert w.read(name) == up.read(name) == stand_in_binary(name, "rocm700")
        requires = [
            line
            for line in w.read(f"{w.dist_info}/METADATA").decode().splitlines()
            if line.startswith("Requires-Dist:")
        ]
    # vLLM's setup.py selected ROCm: requirements/rocm.txt, not cuda.txt
    assert any("amd-quark" in r for r in requires), requires
    assert not any("flashinfer" in r for r in requires), requires
    aiter = aiter_pin(GitTree(config.upstream_repo, tag_for(version)))
    assert record["build"]["rocm"] == {
        "variant": "rocm700",
        "rocm_version": "7.0.0",
        "python": "cp312",
        "aiter": aiter,
    }
    assert record["base"]["upstream_wheel"] == {"filename": pin.filename, "sha256": pin.sha256}
    sbom = json.loads(Path(f"{wheel}.cdx.json").read_text())
    props = {p["name"]: p["value"] for p in sbom["metadata"]["component"]["properties"]}
    assert props["vllm-fork:rocm-variant"] == "rocm700"
    assert props["vllm-fork:aiter-tag"] == aiter

    proc = cli("verify", "--require-release-files", str(wheel))
    say(proc.stdout[-1500:])
    assert proc.returncode == 0, proc.stdout[-3000:]
    proc = cli("audit", "--json", str(wheel))
    audit = json.loads(proc.stdout)
    say(
        f"audit against {audit['upstream_wheel']}: {audit['compared']} compared, "
        f"{audit['differing']} differ, {audit['unexplained']} unexplained"
    )
    for m in audit["members"]:
        say(f"  {m['state']:8} {m['path']}  <- {m['explanation']}")
    assert proc.returncode == 0 and audit["passed"]
    assert audit["upstream_wheel"] == synthetic.name

    proc = cli("publish", str(wheel), "--repository", upload.url)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (upload.packages / wheel.name).is_file()

    py312 = python312()
    if py312 is None:
        pytest.skip("no python3.12 to install the cp312 wheel into")
    venv = tmp_path / "venv312"
    subprocess.run([py312, "-m", "venv", venv], check=True)
    cmd = [str(venv / "bin" / "python"), "-m", "pip", "install", "--no-input", "-q", "--no-deps"]
    cmd += ["--index-url", upload.simple, f"vllm=={result['version']}"]
    say("$ " + " ".join(cmd))
    proc_pip = subprocess.run(cmd, capture_output=True, text=True)
    assert proc_pip.returncode == 0, proc_pip.stderr[-3000:]

    proc = cli("smoke", str(wheel), "--installed", str(venv), "--no-import")
    say(proc.stdout[-3000:])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    # a wheel built on another ROCm wheel than bases.toml pins does not verify
    pins = load_pins(fork_copy / "bases.toml")
    base = pins.get(version)
    other = replace(base.rocm[0], sha256="0" * 64)
    pins.bases[version] = replace(base, rocm=(other,))
    save_pins(fork_copy / "bases.toml", pins)
    proc = cli("verify", str(wheel))
    mismatch = [line for line in proc.stdout.splitlines() if line.startswith("MISMATCH")]
    say("\n".join(mismatch))
    assert proc.returncode == 1
    assert any(f"upstream wheel {pin.filename} sha256" in line for line in mismatch)
    say(
        f"ROCm e2e pin -> build -> verify -> audit -> publish -> install -> smoke: "
        f"{time.monotonic() - start:.0f} s wall"
    )
