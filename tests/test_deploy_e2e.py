"""End to end: the real wheel of the default base, published to a local index and installed.

build (or reuse) the default wheel -> `publish` to pypiserver on 127.0.0.1 ->
`pip install vllm==<version> --index-url http://127.0.0.1:PORT/simple` into a
fresh venv -> `smoke --installed` on what pip installed.

Cheap by default (it runs in CI with the other end-to-end tests): pip installs
the real wheel with --no-deps, and smoke checks the installed files (version,
provenance record, change probes) without importing vLLM. With
VLLM_FORK_E2E_SMOKE=1 pip also installs the dependencies (about 8 GB; the
configured indexes are extra indexes) and smoke imports vLLM on CPU.

The wheel is the session's one online build of the default base (the
``default_wheel`` fixture of conftest.py, shared with test_build_e2e.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from vllm_fork.deploy.publish import publish
from vllm_fork.sources.pipconf import load_pip_config
from vllm_fork.sources.workspace import load_config
from vllm_fork.wheel.smoke import format_result, smoke

from .indexserver import PASSWORD, USER, IndexServer, index_server

pytestmark = [
    pytest.mark.release,  # run by `vllm-fork release-check`, not the test command
    pytest.mark.slow,
    pytest.mark.network,
    pytest.mark.skipif(
        os.environ.get("VLLM_FORK_E2E_BUILD") != "1",
        reason="set VLLM_FORK_E2E_BUILD=1 to build (or reuse) the default wheel for real",
    ),
]

REPO = Path(__file__).resolve().parents[1]
FULL = os.environ.get("VLLM_FORK_E2E_SMOKE") == "1"


def say(text: str) -> None:
    print(text, flush=True)


@pytest.fixture
def server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[IndexServer]:
    monkeypatch.setenv("TWINE_USERNAME", USER)
    monkeypatch.setenv("TWINE_PASSWORD", PASSWORD)
    with index_server(tmp_path / "index") as srv:
        yield srv


def test_publish_install_smoke(default_wheel: Path, server: IndexServer, tmp_path: Path) -> None:
    config = load_config(root=REPO)
    start = time.monotonic()
    version = default_wheel.name.split("-")[1]

    t0 = time.monotonic()
    done = publish(config, [default_wheel], server.url)
    say(f"publish -> {server.url}: {done[0].action} in {time.monotonic() - t0:.1f} s")
    assert [d.action for d in done] == ["uploaded"]
    assert (server.packages / default_wheel.name).stat().st_size == default_wheel.stat().st_size
    t0 = time.monotonic()
    again = publish(config, [default_wheel], server.url)
    say(f"publish again: {again[0].action} in {time.monotonic() - t0:.1f} s")
    assert [d.action for d in again] == ["already there"]

    venv = tmp_path / "venv"
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    cmd = [str(venv / "bin" / "python"), "-m", "pip", "install", "--no-input", "-q"]
    cmd += ["--index-url", server.simple, f"vllm=={version}"]
    if FULL:
        for extra in load_pip_config().indexes:
            cmd += ["--extra-index-url", extra]
    else:
        cmd.append("--no-deps")
    say("$ " + " ".join(cmd))
    proc = subprocess.run(cmd, capture_output=True, text=True)
    say(
        f"pip install from the local index: exit {proc.returncode} in {time.monotonic() - t0:.0f} s"
    )
    assert proc.returncode == 0, proc.stderr[-3000:]

    result = smoke(config, default_wheel, installed=venv, import_vllm=FULL)
    say(format_result(default_wheel, result))
    assert not result.failures
    say(f"e2e publish -> install -> smoke: {time.monotonic() - start:.0f} s wall")


def test_the_release_checks_install_step_on_the_default_wheel(default_wheel: Path) -> None:
    """What `release-check` runs per base after the build: the wheel alone,
    pip-installed into a fresh venv, its files checked without importing vLLM."""
    config = load_config(root=REPO)
    result = smoke(config, default_wheel, deps=False)
    say(format_result(default_wheel, result))
    assert not result.failures
    assert not result.imported
    assert any(line.startswith("installed version") for line in result.lines)
