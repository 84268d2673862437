# SPDX-License-Identifier: Apache-2.0
"""pytest plugin for the fork's GPU tests in a vLLM source tree without its
compiled extension: ``pytest -p fork_gpu`` with ``gpu/`` on ``PYTHONPATH``.

* ``FORK_GPU_KERNEL=DIR``: build ``DIR/csrc/pos_encoding_kernels.cu`` (the
  tree's rotary kernel, alone) as a torch extension and register it as
  ``torch.ops._C.rotary_embedding``; stand-ins for ``vllm._C`` and
  ``vllm._C_stable_libtorch`` let vLLM's CUDA platform import. Build
  outputs go to ``$FORK_GPU_BUILD`` (default: a temporary directory).
  Where the tree has no compiled flash attention (``_vllm_fa2_C`` /
  ``_vllm_fa3_C``), ``vllm.vllm_flash_attn`` is a stand-in that says so:
  its functions raise, its capability queries answer no (vLLM's attention
  utilities import it at module level on the CUDA platform, and upstream's
  kernel test utilities import those).
* Fixtures ``default_vllm_config`` and ``dist_init`` as the tree's root
  conftest defines them, so upstream's kernel tests run unchanged with
  ``--noconftest`` (the root conftest imports the whole engine).
* Marker ``gpu``: the test needs a CUDA device and is skipped without one.
* Every test starts with torch's default device as the session began:
  upstream's kernel tests set it (``torch.set_default_device``) and leave
  it set, which would move the tensors of a later module's test to the GPU.
* Under the ROCm simulation on a CUDA host, vLLM's CUDA platform plugin is
  switched off, so that the simulated ROCm platform is the only one even
  with vLLM's version metadata on the path (which vLLM's Triton check reads),
  and the simulation's stand-ins for CUDA streams (made for hosts without a
  device runtime) give way to the real ones, which graph capture and
  Inductor's generated code use.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import types
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
KERNEL_ENV = "FORK_GPU_KERNEL"
BUILD_ENV = "FORK_GPU_BUILD"


def _stand_in(name: str) -> None:
    if name not in sys.modules:
        sys.modules[name] = types.ModuleType(name)


def load_rope_kernel(src: Path, build: Path) -> None:
    """Build the tree's rotary kernel and register it as _C::rotary_embedding.

    A kernel written against the stable libtorch ABI (``torch::stable``, as
    vLLM builds it into ``_C_stable_libtorch`` from 0.22.0 on) gets the
    stable binding; its helpers include the CUDA runtime and cuBLAS headers
    and the CUDA parts of torch's C shim (``USE_CUDA``)."""
    from torch.utils.cpp_extension import load

    csrc = src / "csrc"
    kernel = csrc / "pos_encoding_kernels.cu"
    if not kernel.is_file():
        raise FileNotFoundError(f"{kernel} is missing")
    build.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0")
    _use_a_compiler_with_shared_libstdcxx(build)
    stable = "torch::stable" in kernel.read_text()
    binding = "binding_stable.cpp" if stable else "binding.cpp"
    defines = ["-DUSE_CUDA"] if stable else []
    load(
        name="fork_gpu_rope_stable" if stable else "fork_gpu_rope",
        sources=[str(HERE / "rope_op" / binding), str(kernel)],
        extra_include_paths=[str(csrc), *_cuda_library_includes()],
        extra_cflags=["-O2", *defines],
        # vLLM builds its kernels with the half/bf16 operators enabled.
        extra_cuda_cflags=[
            *defines,
            "-O2",
            "--expt-relaxed-constexpr",
            "-U__CUDA_NO_HALF_OPERATORS__",
            "-U__CUDA_NO_HALF_CONVERSIONS__",
            "-U__CUDA_NO_BFLOAT16_OPERATORS__",
            "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
            "-U__CUDA_NO_HALF2_OPERATORS__",
        ],
        build_directory=str(build),
        is_python_module=False,
        verbose=False,
    )


STDCXX_PROBE = (
    "#include <sstream>\nstd::string f(long x) { std::ostringstream s; s << x; return s.str(); }\n"
)


def _links_libstdcxx_shared(cxx: str, where: Path) -> bool:
    """Whether cxx links a shared object against the shared libstdc++."""
    out = where / "stdcxx-probe.so"
    try:
        proc = subprocess.run(
            [cxx, "-shared", "-fPIC", "-x", "c++", "-", "-o", str(out)],
            input=STDCXX_PROBE,
            capture_output=True,
            text=True,
            timeout=120,
        )
    except OSError:
        return False
    return proc.returncode == 0 and b"libstdc++.so" in out.read_bytes()


def _use_a_compiler_with_shared_libstdcxx(where: Path) -> None:
    """Build with a C++ compiler that links libstdc++ as a shared library.

    A toolchain that links it statically (a host's own GCC build with only
    ``libstdc++.a``) gives the extension a second copy of the C++ runtime next
    to the one the process has loaded; the two copies' locale facet ids
    disagree, and formatting a number into the message of a failed check
    (``std::ostream::operator<<(long)`` under STD_TORCH_CHECK) crashes with
    SIGSEGV instead of raising. ``CXX``/``CC`` name the compiler torch uses."""
    current = os.environ.get("CXX") or "c++"
    if _links_libstdcxx_shared(current, where):
        return
    for cxx, cc in (("c++", "cc"), ("g++", "gcc"), ("/usr/bin/g++", "/usr/bin/gcc")):
        path = shutil.which(cxx)
        if path and path != shutil.which(current) and _links_libstdcxx_shared(path, where):
            os.environ["CXX"] = path
            os.environ["CC"] = shutil.which(cc) or cc
            print(f"fork_gpu: {current} links libstdc++ statically; building with {path}")
            return
    print(f"fork_gpu: no compiler here links libstdc++ as a shared library ({current} does not)")


def _cuda_library_includes() -> list[str]:
    """Include directories of the CUDA libraries installed as Python packages
    (``nvidia/<lib>/include``, as torch's CUDA wheels pull them in), for a
    host whose CUDA toolkit lacks a library's headers (cuBLAS)."""
    found = []
    for entry in sys.path:
        for include in sorted(Path(entry or ".").glob("nvidia/*/include")):
            if (include / "cublas_v2.h").is_file() and str(include) not in found:
                found.append(str(include))
    return found


def _no_cuda_platform_under_the_sim() -> None:
    sim = sys.modules.get("vllm_rocm_sim")
    if sim is None or not sim.is_active():
        return
    import vllm.platforms as platforms

    if "cuda" in platforms.builtin_platform_plugins:
        platforms.builtin_platform_plugins["cuda"] = lambda: None


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (skipped without one)")
    _no_cuda_platform_under_the_sim()
    src = os.environ.get(KERNEL_ENV)
    if src and torch.cuda.is_available():
        if "vllm" in sys.modules:
            raise RuntimeError("vLLM was imported before the kernel stand-in was set up")
        build = Path(os.environ.get(BUILD_ENV) or tempfile.mkdtemp(prefix="fork-gpu-build-"))
        load_rope_kernel(Path(src), build)
        _stand_in("vllm._C")
        _stand_in("vllm._C_stable_libtorch")
        _no_cutlass()
        _no_flash_attn(Path(src))


_LIBS: list[torch.library.Library] = []


# Capability queries of vLLM's extension that its quantization helpers ask
# at import time (upstream's kernel test utilities import them).
CUTLASS_QUERIES = (
    "cutlass_scaled_mm_supports_fp8",
    "cutlass_scaled_mm_supports_block_fp8",
    "cutlass_scaled_mm_supports_fp4",
)


def _no_cutlass() -> None:
    """vLLM's quantization helpers (imported by upstream's test utilities)
    ask the extension at import whether its CUTLASS kernels support the
    device: this build has none of them, so each query answers no."""
    lib = torch.library.Library("_C", "FRAGMENT")
    for query in CUTLASS_QUERIES:
        if hasattr(torch.ops._C, query):
            continue
        lib.define(f"{query}(int cuda_device_capability) -> bool")
        lib.impl(query, lambda capability: False, "CompositeExplicitAutograd")
    _LIBS.append(lib)


FLASH_ATTN = "vllm.vllm_flash_attn"
FLASH_ATTN_MISSING = (
    "vLLM's flash attention extension (_vllm_fa2_C or _vllm_fa3_C) is not built here"
)
# What vLLM imports from vllm.vllm_flash_attn at module level.
FLASH_ATTN_FUNCTIONS = (
    "flash_attn_varlen_func",
    "get_scheduler_metadata",
    "compile_flash_attn_varlen_func_from_specs",
)


def _no_flash_attn(tree: Path) -> None:
    """A stand-in for vllm.vllm_flash_attn in a tree without its compiled
    extensions: every function raises, and the queries say no version is
    supported, so nothing can run on it unnoticed."""
    package = tree / "vllm" / "vllm_flash_attn"
    if not package.is_dir() or any(package.glob("_vllm_fa*_C*")):
        return
    module = types.ModuleType(FLASH_ATTN)
    module.__doc__ = f"Stand-in: {FLASH_ATTN_MISSING}."

    def missing(name: str):
        def call(*args: object, **kwargs: object) -> None:
            raise RuntimeError(f"{FLASH_ATTN}.{name}: {FLASH_ATTN_MISSING}")

        call.__name__ = name
        return call

    for name in FLASH_ATTN_FUNCTIONS:
        setattr(module, name, missing(name))
    module.FA2_AVAILABLE = False
    module.FA3_AVAILABLE = False
    module.is_fa_version_supported = lambda *args, **kwargs: False
    module.fa_version_unsupported_reason = lambda *args, **kwargs: FLASH_ATTN_MISSING
    sys.modules[FLASH_ATTN] = module


def pytest_report_header(config: pytest.Config) -> str:
    src = os.environ.get(KERNEL_ENV)
    cuda = torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA device"
    return f"fork_gpu: torch {torch.__version__}, {cuda}, rotary kernel from {src or '-'}"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(skip)


# What the ROCm simulation replaces for CPU hosts (no device runtime there):
# on a CUDA host, CUDA graph capture and Inductor's code need the real ones.
_CUDA_STREAM_API = {
    name: getattr(torch.cuda, name)
    for name in ("current_stream", "synchronize", "is_current_stream_capturing")
}
_SIM_STREAM_FIXTURES = ("_simulated_streams", "_simulated_stream_capture")


@pytest.fixture(autouse=True)
def _real_cuda_streams(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    if not torch.cuda.is_available():
        return
    for name in _SIM_STREAM_FIXTURES:
        if name in request.fixturenames:
            request.getfixturevalue(name)  # let the simulation patch first
    for name, fn in _CUDA_STREAM_API.items():
        monkeypatch.setattr(torch.cuda, name, fn)


@pytest.fixture(autouse=True)
def _default_device_as_the_test_began() -> Iterator[None]:
    before = torch.get_default_device()
    yield
    if torch.get_default_device() != before:
        # None drops the default-device mode torch installs for a device.
        torch.set_default_device(None if before.type == "cpu" else before)


@pytest.fixture
def default_vllm_config() -> Iterator[object]:
    from vllm.config import VllmConfig, set_current_vllm_config

    config = VllmConfig()
    with set_current_vllm_config(config):
        yield config


@pytest.fixture
def dist_init() -> Iterator[None]:
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.distributed import (
        cleanup_dist_env_and_memory,
        init_distributed_environment,
        initialize_model_parallel,
    )

    fd, path = tempfile.mkstemp()
    os.close(fd)
    try:
        with set_current_vllm_config(VllmConfig()):
            init_distributed_environment(
                world_size=1,
                rank=0,
                distributed_init_method=f"file://{path}",
                local_rank=0,
                backend="nccl" if torch.cuda.is_available() else "gloo",
            )
            initialize_model_parallel(1, 1)
        yield
    finally:
        cleanup_dist_env_and_memory()
        # torch's file store removes its file once the group is destroyed.
        Path(path).unlink(missing_ok=True)
