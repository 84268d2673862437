"""The environment and command of one wheel build: a pure function of its inputs.

vLLM's own PEP 517 backend, named by ``build-system.build-backend`` (and
``backend-path``) of the tree's pyproject.toml (:func:`read_backend`), has its
``build_wheel`` hook called once through ``pyproject_hooks``, in the tree, by
the build environment's Python, without build isolation: the build
environment is prepared (and cached) by the tool. The hook returns the name
of the wheel it wrote. Modes:

- ``precompiled``: vLLM's precompiled mode, fed with the pinned upstream
  wheel of the same version (``VLLM_PRECOMPILED_WHEEL_LOCATION``): the CUDA
  wheel for ``cuda``, the pinned ROCm wheel for ``rocm`` (by file: vLLM's own
  look-up of a ROCm index is never reached, and its index URL is pointed at a
  refusing address besides);
- ``full``: the CMake extension build for ``cuda`` or ``rocm``;
- ``empty``: vLLM's pure-Python target (``VLLM_TARGET_DEVICE=empty``).
"""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

MODES = ("precompiled", "full", "empty")
DEVICES = ("cuda", "rocm")
LIMITED_API = "cp38"
DEFAULT_CUDA_ARCHS = "7.5 8.0 8.6 8.9 9.0 10.0 11.0 12.0+PTX"  # upstream docker/Dockerfile
DEFAULT_ROCM_ARCHS = "gfx942;gfx950"  # MI300 and MI350/MI355 class, the fork's targets

# Offline sources of what vLLM's CMake fetches at configure time: option name -> variable.
SOURCE_VARS: dict[str, str] = {
    "cutlass": "VLLM_CUTLASS_SRC_DIR",
    "flash-attn": "VLLM_FLASH_ATTN_SRC_DIR",
    "flashmla": "FLASH_MLA_SRC_DIR",
    "deepgemm": "DEEPGEMM_SRC_DIR",
    "qutlass": "QUTLASS_SRC_DIR",
    "triton-kernels": "TRITON_KERNELS_SRC_DIR",
}

# Variables of the caller's environment that would change what vLLM builds: the
# plan sets its own values or removes them.
SCRUBBED = (
    "VLLM_TARGET_DEVICE",
    "VLLM_USE_PRECOMPILED",
    "VLLM_PRECOMPILED_WHEEL_LOCATION",
    "VLLM_PRECOMPILED_WHEEL_VARIANT",
    "VLLM_PRECOMPILED_WHEEL_COMMIT",
    "VLLM_SKIP_PRECOMPILED_VERSION_SUFFIX",
    "VLLM_VERSION_OVERRIDE",
    "VLLM_MAIN_CUDA_VERSION",
    "VLLM_DOCKER_BUILD_CONTEXT",
    "VLLM_ROCM_WHEEL_INDEX",
    "VLLM_FORK_TORCH_HIP",
    "SETUPTOOLS_SCM_PRETEND_VERSION",
    "SETUPTOOLS_SCM_PRETEND_VERSION_FOR_VLLM",
    "PYTHONPATH",
    "PIP_NO_BUILD_ISOLATION",
    *SOURCE_VARS.values(),
)

# A precompiled ROCm build: vLLM's setup.py selects ROCm (its requirements, its
# extension list, whose binaries it copies) by torch.version.hip and compiles nothing.
# Where the build torch is no ROCm build, this directory's sitecustomize gives
# torch.version.hip the pinned wheel's ROCm version (VLLM_FORK_TORCH_HIP).
ROCM_VIEW = Path(__file__).resolve().parent / "inside" / "rocm_view"
REFUSED_INDEX = "http://127.0.0.1:9/refused"  # the discard port: a look-up fails at once

# PEP 517: a project without build-system.build-backend is built by setuptools' legacy backend.
LEGACY_BACKEND = "setuptools.build_meta:__legacy__"


@dataclass(frozen=True)
class Backend:
    """A PEP 517 build backend: ``build-system.build-backend`` and ``backend-path``."""

    name: str
    path: tuple[str, ...] = ()


def read_backend(tree: Path) -> Backend:
    """The build backend declared by ``tree/pyproject.toml``."""
    pyproject = Path(tree) / "pyproject.toml"
    try:
        data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return Backend(LEGACY_BACKEND)
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise PlanError(f"{pyproject}: {exc}") from None
    system = data.get("build-system", {})
    if not isinstance(system, dict):
        raise PlanError(f"{pyproject}: [build-system] is not a table")
    name = system.get("build-backend", LEGACY_BACKEND)
    path = system.get("backend-path", [])
    if not isinstance(name, str) or not name.strip():
        raise PlanError(f"{pyproject}: build-system.build-backend is not a module name")
    if not isinstance(path, list) or not all(isinstance(p, str) for p in path):
        raise PlanError(f"{pyproject}: build-system.backend-path is not a list of paths")
    return Backend(name.strip(), tuple(path))


# An offline build (--offline): nothing may reach the network, and whatever tries
# fails at once with a clear error instead of hanging on a timeout.
OFFLINE_PROXY = "http://127.0.0.1:9"  # the discard port: connections are refused
OFFLINE_ENV = {
    "PIP_NO_INDEX": "1",
    "HF_HUB_OFFLINE": "1",
    **{name: OFFLINE_PROXY for name in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY")},
    "ALL_PROXY": OFFLINE_PROXY,
    "no_proxy": "",
    "NO_PROXY": "",
}


@dataclass(frozen=True)
class FullOptions:
    """Settings of a full (compiling) build."""

    cuda_archs: str = DEFAULT_CUDA_ARCHS
    rocm_archs: str = DEFAULT_ROCM_ARCHS
    max_jobs: int | None = None
    nvcc_threads: int | None = None
    sources: Mapping[str, Path] = field(default_factory=dict)
    ccache: str | None = None  # path of ccache, when it is to be used
    build_type: str | None = None  # CMAKE_BUILD_TYPE; vLLM's default when None


@dataclass(frozen=True)
class BuildPlan:
    mode: str
    device: str
    version: str
    tree: Path
    out_dir: Path
    set_env: dict[str, str]
    unset_env: tuple[str, ...]
    python: str
    backend: Backend | None  # None: read from the tree when it exists (dry run)
    config_settings: dict[str, Any]
    plat_name: str | None

    def environ(self, base: Mapping[str, str]) -> dict[str, str]:
        """The build's full environment, given the caller's."""
        env = {k: v for k, v in base.items() if k not in self.unset_env}
        env.update(self.set_env)
        return env

    def render(self, environ: Mapping[str, str] | None = None) -> str:
        """Shell text equivalent to the plan (what ``--dry-run`` prints); ``unset`` lines
        only for variables set in ``environ`` (all scrubbed ones when None)."""
        lines = [f"cd {shlex.quote(str(self.tree))}"]
        lines += [
            f"unset {name}"
            for name in self.unset_env
            if name not in self.set_env and (environ is None or name in environ)
        ]
        lines += [f"export {k}={shlex.quote(v)}" for k, v in sorted(self.set_env.items())]
        if self.backend is None:
            backend = "the backend named by build-system.build-backend of pyproject.toml"
        else:
            backend = self.backend.name
            if self.backend.path:
                backend += f" (backend-path {', '.join(self.backend.path)})"
        lines.append(
            f"# PEP 517 build_wheel hook of {backend}, called through pyproject_hooks "
            f"by {shlex.quote(self.python)}:"
        )
        lines.append(
            f"# build_wheel({str(self.out_dir)!r}, {json.dumps(self.config_settings)}) "
            "-> the wheel's file name"
        )
        return "\n".join(lines)


class PlanError(ValueError):
    pass


def _check_full(device: str, full: FullOptions) -> None:
    unknown = sorted(set(full.sources) - set(SOURCE_VARS))
    if unknown:
        raise PlanError(
            f"unknown source name(s) {', '.join(unknown)} (known: {', '.join(SOURCE_VARS)})"
        )
    if full.max_jobs is not None and full.max_jobs < 1:
        raise PlanError("MAX_JOBS must be >= 1")
    if full.nvcc_threads is not None and (full.nvcc_threads < 1 or device != "cuda"):
        raise PlanError("NVCC_THREADS must be >= 1 and applies to --device cuda only")
    if full.build_type not in (None, "Release", "RelWithDebInfo", "Debug"):
        raise PlanError(f"unknown CMake build type {full.build_type!r}")


def plan_build(
    *,
    mode: str,
    device: str,
    python: str,
    tree: Path,
    out_dir: Path,
    version: str,
    source_date_epoch: int,
    backend: Backend | None = None,
    plat_name: str | None = None,
    upstream_wheel: Path | None = None,
    full: FullOptions | None = None,
    offline: bool = False,
    rocm_version: str | None = None,
) -> BuildPlan:
    """The environment and command that build ``tree`` into a wheel in ``out_dir``;
    ``offline``: the build must not reach the network (OFFLINE_ENV; a full build's
    CMake must not download what it fetches at configure time)."""
    if mode not in MODES:
        raise PlanError(f"unknown build mode {mode!r} (known: {', '.join(MODES)})")
    if device not in DEVICES:
        raise PlanError(f"unknown device {device!r} (known: {', '.join(DEVICES)})")
    env: dict[str, str] = {
        "VLLM_VERSION_OVERRIDE": version,
        "SOURCE_DATE_EPOCH": str(source_date_epoch),
        "PYTHONNOUSERSITE": "1",
    }
    build_options: list[str] = []
    if mode == "empty":
        env["VLLM_TARGET_DEVICE"] = "empty"
        plat_name = None
    else:
        if not plat_name:
            raise PlanError(f"a {mode} build needs a platform tag (e.g. manylinux_2_28_x86_64)")
        build_options = [f"--py-limited-api={LIMITED_API}", f"--plat-name={plat_name}"]
    if mode == "precompiled":
        if upstream_wheel is None:
            raise PlanError("a precompiled build needs the upstream wheel")
        if device == "rocm" and not rocm_version:
            raise PlanError("a precompiled ROCm build needs the pinned ROCm wheel's version")
        env["VLLM_TARGET_DEVICE"] = device
        env["VLLM_USE_PRECOMPILED"] = "1"
        env["VLLM_PRECOMPILED_WHEEL_LOCATION"] = str(upstream_wheel)
        if device == "rocm":
            env["VLLM_ROCM_WHEEL_INDEX"] = REFUSED_INDEX
            env["VLLM_FORK_TORCH_HIP"] = str(rocm_version)
            env["PYTHONPATH"] = str(ROCM_VIEW)
    elif mode == "full":
        full = full or FullOptions()
        _check_full(device, full)
        env["VLLM_TARGET_DEVICE"] = device
        if device == "cuda":
            env["TORCH_CUDA_ARCH_LIST"] = full.cuda_archs
            if full.nvcc_threads is not None:
                env["NVCC_THREADS"] = str(full.nvcc_threads)
        else:
            env["PYTORCH_ROCM_ARCH"] = full.rocm_archs
        if full.max_jobs is not None:
            env["MAX_JOBS"] = str(full.max_jobs)
        if full.build_type:
            env["CMAKE_BUILD_TYPE"] = full.build_type
        for name, path in sorted(full.sources.items()):
            env[SOURCE_VARS[name]] = str(path)
        if full.ccache:
            langs = ("C", "CXX", "CUDA") if device == "cuda" else ("C", "CXX", "HIP")
            for lang in langs:
                env[f"CMAKE_{lang}_COMPILER_LAUNCHER"] = full.ccache
            # Every build runs in a new copy: hash paths relative to it so that
            # the cache hits across builds.
            env["CCACHE_BASEDIR"] = str(tree)
            env["CCACHE_NOHASHDIR"] = "1"
    if offline:
        env.update(OFFLINE_ENV)
        if mode == "full":
            env["CMAKE_ARGS"] = "-DFETCHCONTENT_FULLY_DISCONNECTED=ON"
    settings: dict[str, Any] = {"--build-option": build_options} if build_options else {}
    return BuildPlan(
        mode=mode,
        device=device,
        version=version,
        tree=tree,
        out_dir=out_dir,
        set_env=env,
        unset_env=SCRUBBED,
        python=python,
        backend=backend,
        config_settings=settings,
        plat_name=plat_name,
    )
