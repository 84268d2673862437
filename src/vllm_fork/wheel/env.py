"""The Python environment a build runs in, and the checks made before a build starts.

By default the tool keeps one virtual environment per (requirements file
content, Python version) under ``<cache>/build-env/``, made by uv, or pip where
uv is absent (:mod:`vllm_fork.sources.installer`: the user's pip and uv index
configuration applies to both) from the base's own ``requirements/build/<device>.txt``:
a CUDA build of the pinned torch for ``cuda``, the ROCm build for ``rocm``.
``--build-python`` uses an existing interpreter instead; nothing is installed
into it.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from vllm_fork.cache import BUILD_ENV_READY as READY
from vllm_fork.cache import LAST_USED
from vllm_fork.config import torch_spec
from vllm_fork.errors import ForkError
from vllm_fork.hashing import sha256_file
from vllm_fork.lock import cache_lock
from vllm_fork.sources.installer import InstallerError, installer
from vllm_fork.sources.workspace import Workspace
from vllm_fork.wheel.inside import script

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


class BuildEnvError(ForkError):
    """The build environment or toolchain cannot build what was asked."""


# Where a base keeps its build requirements per device, newest layout first:
# requirements/build/<device>.txt from 0.20.0, requirements/build.txt (cuda)
# and requirements/<device>-build.txt before.
_REQUIREMENTS_LAYOUTS = ("requirements/build/{device}.txt", "requirements/{device}-build.txt")
_LEGACY_CUDA = "requirements/build.txt"


def requirements_file(tree: Path, device: str) -> Path:
    """The base's own build requirements for ``device`` (empty mode uses cuda's)."""
    candidates = [layout.format(device=device) for layout in _REQUIREMENTS_LAYOUTS]
    if device == "cuda":
        candidates.insert(1, _LEGACY_CUDA)
    for name in candidates:
        path = Path(tree) / name
        if path.is_file():
            return path
    raise BuildEnvError(f"the base has no {candidates[0]} (nor {', '.join(candidates[1:])})")


# What vLLM's setup.py needs to run its precompiled path (it compiles nothing there):
# the build backend and its tools, and an importable torch (it reads torch.version).
PRECOMPILED_ROCM_TOOLS = ("setuptools", "setuptools-scm", "wheel", "packaging", "jinja2")


def precompiled_rocm_requirements(tree: Path, work: Path) -> Path:
    """The requirements of a precompiled ROCm build's environment, written into ``work``.

    The base's ``requirements/build/rocm.txt`` wants ROCm's torch (several GB, from
    download.pytorch.org) and the ROCm tool chain, which only a compiling build uses.
    vLLM's precompiled path imports torch only to read ``torch.version``: the
    build tools' lines of that file are kept and torch is the CPU build the fork's
    tree venvs use (``TREE_TORCH``); the plan gives torch.version.hip the pinned ROCm
    version (:data:`vllm_fork.wheel.plan.ROCM_VIEW`)."""
    source = requirements_file(tree, "rocm")
    keep = [
        str(req)
        for req in requirement_lines(source)
        if canonicalize_name(req.name) in PRECOMPILED_ROCM_TOOLS
    ]
    names = {canonicalize_name(Requirement(r).name) for r in keep}
    keep += [t for t in PRECOMPILED_ROCM_TOOLS if t not in names]
    keep.append(torch_spec())
    out = Path(work) / "precompiled-rocm.txt"
    out.write_text("".join(f"{r}\n" for r in sorted(keep)))
    return out


def requirement_lines(path: Path) -> Iterator[Requirement]:
    """The requirements a pip requirements file names, skipping comments, options
    (``-r``, ``--index-url`` ...) and lines that are no PEP 508 requirement."""
    for line in path.read_text().splitlines():
        text = line.split("#", 1)[0].strip()
        if not text or text.startswith("-"):
            continue
        try:
            yield Requirement(text)
        except InvalidRequirement:
            continue


def env_key(requirements: Path, python_version: str) -> str:
    digest = sha256_file(requirements)[:12]
    return f"py{python_version}-{requirements.stem}-{digest}"


log = logging.getLogger(__name__)

CONSTRAINTS = "vllm-fork-constraints.txt"


def cpu_torch_exclusions(requirements: Path) -> list[str]:
    """pip constraints that keep a CPU-only build of the pinned torch out of a
    build environment. For ``torch==X`` pip takes ``X+cpu`` from a wheel
    directory or mirror of the user's configuration over the index's device
    build ``X`` (a local version label sorts after the public version), and a
    precompiled or full build cannot run with it."""
    out: list[str] = []
    for req in requirement_lines(requirements):
        if canonicalize_name(req.name) != "torch":
            continue
        for spec in req.specifier:
            if spec.operator == "==" and "+" not in spec.version and "*" not in spec.version:
                out.append(f"torch!={spec.version}+cpu")
    return out


def _cpu_torch_installed(env_dir: Path) -> str | None:
    """The installed torch's version when it is a CPU-only build, else None."""
    for info in env_dir.glob("lib/python*/site-packages/torch-*.dist-info"):
        version = info.name[len("torch-") : -len(".dist-info")]
        if version.endswith("+cpu"):
            return version
    return None


def ensure_build_env(
    config: Workspace,
    requirements: Path,
    python: str = sys.executable,
    *,
    allow_cpu_torch: bool = False,
) -> Path:
    """The cached environment for ``requirements``, created on first use; its python
    (``allow_cpu_torch``: a CPU-only torch is what the environment is for)."""
    version = _run_probe(python, "version")["python"]
    root = config.cache.build_envs
    key = env_key(requirements, version)
    env_dir = config.cache.build_env(key)
    env_python = config.cache.build_env_python(key)
    with cache_lock(root):
        if (env_dir / READY).is_file():
            cpu_torch = _cpu_torch_installed(env_dir)
            if cpu_torch is None or allow_cpu_torch:
                (env_dir / LAST_USED).touch()  # `vllm-fork cache prune` keeps it
                return env_python
            log.warning(
                f"the build environment {env_dir} holds the CPU-only torch {cpu_torch}; "
                "creating it again without it"
            )
        shutil.rmtree(env_dir, ignore_errors=True)
        log.info(
            f"creating the build environment {env_dir} from {requirements.name} "
            "(once; several GB for a CUDA or ROCm torch)"
        )
        start = time.monotonic()
        tool = installer()
        try:
            tool.create(env_dir, python)
            constraints = env_dir / CONSTRAINTS
            excluded = [] if allow_cpu_torch else cpu_torch_exclusions(requirements)
            constraints.write_text("".join(f"{c}\n" for c in excluded))
            tool.install(env_python, ["-r", str(requirements), "-c", str(constraints)])
        except (OSError, InstallerError) as exc:
            shutil.rmtree(env_dir, ignore_errors=True)
            raise BuildEnvError(
                f"cannot create the build environment from {requirements}: {exc}"
            ) from None
        (env_dir / READY).write_text(requirements.read_text())
        (env_dir / LAST_USED).touch()
        log.info(f"build environment ready in {time.monotonic() - start:.0f} s")
    return env_python


@dataclass(frozen=True)
class PythonInfo:
    python: str
    version: str
    packages: dict[str, str | None]
    torch_cuda: str | None
    torch_hip: str | None
    torch_error: str | None


def _run_probe(python: str, *args: str) -> dict[str, Any]:
    """The JSON object printed by ``inside/pyinfo.py`` run by ``python``."""
    try:
        proc = subprocess.run(
            [python, "-I", script("pyinfo"), *args], capture_output=True, text=True
        )
    except OSError as exc:
        raise BuildEnvError(f"cannot run the build Python {python}: {exc}") from None
    if proc.returncode != 0:
        raise BuildEnvError(f"cannot run the build Python {python}: {proc.stderr.strip()}")
    lines = proc.stdout.strip().splitlines()
    try:
        data = json.loads(lines[-1])
    except (IndexError, ValueError):
        raise BuildEnvError(
            f"the build Python {python} printed no report: {proc.stdout.strip()[-200:]!r}"
        ) from None
    if not isinstance(data, dict) or "python" not in data:
        raise BuildEnvError(f"the build Python {python} printed an unexpected report")
    return data


def probe_python(python: str) -> PythonInfo:
    data = _run_probe(python)
    return PythonInfo(
        python=python,
        version=data.pop("python"),
        torch_cuda=data.pop("torch_cuda", None),
        torch_hip=data.pop("torch_hip", None),
        torch_error=data.pop("torch_error", None),
        packages=data,
    )


def _release(text: str | None) -> Version | None:
    try:
        return Version(Version(text).base_version) if text else None
    except InvalidVersion:
        return None


def check_build_python(
    info: PythonInfo, mode: str, device: str, pinned_torch: str | None
) -> list[str]:
    """Problems that stop the build; empty when the interpreter can build ``mode``."""
    problems: list[str] = []
    pk = info.packages
    setuptools = _release(pk.get("setuptools"))
    if setuptools is None or not (Version("77.0.3") <= setuptools < Version("81")):
        problems.append(f"setuptools>=77.0.3,<81 is needed, found {pk.get('setuptools')}")
    if not pk.get("setuptools-scm"):
        problems.append("setuptools-scm is needed (vLLM's setup.py imports it)")
    if not pk.get("torch") or info.torch_error:
        problems.append(
            "torch is needed (vLLM's setup.py imports it)"
            + (f": {info.torch_error}" if info.torch_error else "")
        )
        return problems
    if mode == "empty":
        return problems
    if device == "cuda" and not info.torch_cuda:
        problems.append(
            f"a CUDA build of torch is needed for --device cuda, found torch {pk['torch']} "
            "without CUDA (vLLM reads torch.version.cuda to select the build and its "
            "requirements)"
        )
    # a precompiled ROCm build compiles nothing: the plan gives torch.version.hip the
    # pinned wheel's ROCm version when the build torch has none (plan.ROCM_VIEW)
    if device == "rocm" and mode == "full" and not info.torch_hip:
        problems.append(f"a ROCm build of torch is needed for --device rocm, found {pk['torch']}")
    if mode == "full":
        for tool in ("cmake", "ninja"):
            if not pk.get(tool) and not shutil.which(tool):
                problems.append(f"{tool} is needed for a full build")
        if pinned_torch and _release(pk["torch"]) != _release(pinned_torch):
            problems.append(
                f"the base pins torch {pinned_torch}; compiled extensions must be built "
                f"against it, found {pk['torch']}"
            )
    return problems


def _nvcc() -> str | None:
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home and Path(home, "bin", "nvcc").is_file():
        return str(Path(home, "bin", "nvcc"))
    return shutil.which("nvcc") or (
        "/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").is_file() else None
    )


def _hipcc() -> str | None:
    home = os.environ.get("ROCM_PATH") or os.environ.get("ROCM_HOME") or "/opt/rocm"
    if Path(home, "bin", "hipcc").is_file():
        return str(Path(home, "bin", "hipcc"))
    return shutil.which("hipcc")


def nvcc_version(nvcc: str) -> str | None:
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
    except OSError:
        return None
    words = out.replace(",", " ").split()
    if "release" in words:
        return words[words.index("release") + 1]
    return None


def compiler_missing(device: str) -> str | None:
    """Why a full build for ``device`` cannot start here (no nvcc / hipcc), or None."""
    if device == "cuda" and _nvcc() is None:
        return (
            "nvcc not found (set CUDA_HOME or put nvcc on PATH): a full CUDA build needs "
            "the CUDA toolkit matching the build torch's CUDA"
        )
    if device == "rocm" and _hipcc() is None:
        return (
            "hipcc not found (set ROCM_PATH or put hipcc on PATH): a full ROCm build needs "
            "ROCm matching the build torch's HIP"
        )
    return None


def check_toolchain(device: str, info: PythonInfo) -> list[str]:
    """Problems of the GPU compiler for a full build (empty when it can start)."""
    problems: list[str] = []
    if device == "cuda":
        nvcc = _nvcc()
        if nvcc is None:
            return [
                "nvcc not found (set CUDA_HOME or put nvcc on PATH); a full CUDA build "
                "needs the CUDA toolkit matching torch's CUDA "
                f"{info.torch_cuda or '(torch has no CUDA)'}"
            ]
        found = nvcc_version(nvcc)
        if info.torch_cuda and found and found.split(".")[0] != info.torch_cuda.split(".")[0]:
            problems.append(f"nvcc {found} ({nvcc}) does not match torch's CUDA {info.torch_cuda}")
    else:
        hipcc = _hipcc()
        if hipcc is None:
            problems.append(
                "hipcc not found (set ROCM_PATH or put hipcc on PATH); a full ROCm build "
                "needs ROCm matching torch's HIP "
                f"{info.torch_hip or '(torch has no HIP)'}"
            )
    return problems


def build_environment(python: str, tree: Path) -> dict[str, str | None]:
    """Versions in the build environment: Python, torch, the build backend and its tools."""
    info = probe_python(python)
    env: dict[str, str | None] = {"python": info.version}
    env.update(info.packages)
    try:
        with open(tree / "pyproject.toml", "rb") as fh:
            env["build-backend"] = tomllib.load(fh)["build-system"]["build-backend"]
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        env["build-backend"] = None
    env["torch-cuda"] = info.torch_cuda
    env["torch-hip"] = info.torch_hip
    return env
