"""The cached build environment keeps a CPU-only torch out."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_fork.cache import BUILD_ENV_READY, LAST_USED, CacheLayout
from vllm_fork.sources.workspace import Workspace
from vllm_fork.wheel import env as build_env
from vllm_fork.wheel.env import (
    CONSTRAINTS,
    BuildEnvError,
    cpu_torch_exclusions,
    ensure_build_env,
    requirements_file,
)

REQS = """\
# comment
cmake>=3.26.1
setuptools>=77.0.3,<81.0.0
torch==2.13.0  # pinned
--extra-index-url https://example.invalid/simple
wheel
"""


def test_exclusions_name_the_cpu_build_of_the_pinned_torch(tmp_path: Path) -> None:
    reqs = tmp_path / "cuda.txt"
    reqs.write_text(REQS)
    assert cpu_torch_exclusions(reqs) == ["torch!=2.13.0+cpu"]
    reqs.write_text("torch>=2.11\nTorch==2.14.0+cu130\nnumpy==2.0.0\n")
    assert cpu_torch_exclusions(reqs) == []


def _fake_env(cache: Path, reqs: Path, torch_version: str) -> Path:
    key = build_env.env_key(reqs, build_env._run_probe(sys.executable, "version")["python"])
    env_dir = CacheLayout(cache).build_env(key)
    site = env_dir / "lib" / "python3.11" / "site-packages"
    (site / f"torch-{torch_version}.dist-info").mkdir(parents=True)
    (env_dir / BUILD_ENV_READY).write_text(reqs.read_text())
    return env_dir


@pytest.fixture(params=["uv", "pip"])
def pip_calls(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The installer commands run (uv's, or pip's with VLLM_FORK_INSTALLER=pip),
    each answered as done."""
    monkeypatch.setenv("VLLM_FORK_INSTALLER", request.param)
    calls: list[list[str]] = []
    real_run = subprocess.run

    def run(cmd, **kwargs):
        cmd = [str(c) for c in cmd]
        if "-I" in cmd or cmd[-2:] == ["config", "list"]:  # the probe, pip's configuration
            return real_run(cmd, **kwargs)
        calls.append(cmd)
        if "venv" in cmd[:3]:
            Path(cmd[-1]).mkdir(parents=True, exist_ok=True)
        return subprocess.CompletedProcess(cmd, 0, stdout="")

    monkeypatch.setattr(build_env.subprocess, "run", run)
    return calls


def test_env_with_a_cpu_torch_is_made_again(tmp_path: Path, pip_calls: list[list[str]]) -> None:
    reqs = tmp_path / "cuda.txt"
    reqs.write_text(REQS)
    env_dir = _fake_env(tmp_path / "cache", reqs, "2.13.0+cpu")
    config = Workspace(root=tmp_path, cache_dir=tmp_path / "cache")

    python = ensure_build_env(config, reqs)

    assert python == env_dir / "bin" / "python"
    create, install = pip_calls
    assert create[-1] == str(env_dir)
    assert "install" in install and ("uv" in Path(install[0]).name) == ("--no-config" in install)
    assert install[install.index("-c") + 1] == str(env_dir / CONSTRAINTS)
    assert (env_dir / CONSTRAINTS).read_text() == "torch!=2.13.0+cpu\n"
    assert not list(env_dir.glob("lib/python*/site-packages/torch-*"))


def test_env_with_a_device_torch_is_reused(tmp_path: Path, pip_calls: list[list[str]]) -> None:
    reqs = tmp_path / "cuda.txt"
    reqs.write_text(REQS)
    env_dir = _fake_env(tmp_path / "cache", reqs, "2.13.0")
    config = Workspace(root=tmp_path, cache_dir=tmp_path / "cache")

    assert ensure_build_env(config, reqs) == env_dir / "bin" / "python"
    assert pip_calls == []
    # each use is stamped: `vllm-fork cache prune` keeps what was used lately
    assert (env_dir / LAST_USED).is_file()
    os.utime(env_dir / LAST_USED, (0, 0))
    ensure_build_env(config, reqs)
    assert (env_dir / LAST_USED).stat().st_mtime > 0


@pytest.mark.parametrize(
    ("files", "device", "expected"),
    [
        # 0.20.0 and later
        (
            ["requirements/build/cuda.txt", "requirements/build.txt"],
            "cuda",
            "requirements/build/cuda.txt",
        ),
        (["requirements/build/rocm.txt"], "rocm", "requirements/build/rocm.txt"),
        # 0.19.1 and earlier
        (
            ["requirements/build.txt", "requirements/rocm-build.txt"],
            "cuda",
            "requirements/build.txt",
        ),
        (
            ["requirements/build.txt", "requirements/rocm-build.txt"],
            "rocm",
            "requirements/rocm-build.txt",
        ),
    ],
)
def test_requirements_file_follows_the_base_layout(
    tmp_path: Path, files: list[str], device: str, expected: str
) -> None:
    for name in files:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("torch==2.10.0\n")
    assert requirements_file(tmp_path, device) == tmp_path / expected


def test_requirements_file_missing_names_what_it_looked_for(tmp_path: Path) -> None:
    (tmp_path / "requirements/build.txt").parent.mkdir(parents=True)
    (tmp_path / "requirements/build.txt").write_text("torch\n")
    with pytest.raises(BuildEnvError, match="requirements/build/rocm.txt"):
        requirements_file(tmp_path, "rocm")
