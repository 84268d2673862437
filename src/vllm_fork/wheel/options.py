"""Settings of a full build from a TOML file the user points at (``--build-config``).

Example::

    [full]
    cuda-archs = "9.0 10.0"        # TORCH_CUDA_ARCH_LIST
    rocm-archs = "gfx942;gfx950"   # PYTORCH_ROCM_ARCH
    max-jobs = 32                  # MAX_JOBS
    nvcc-threads = 4               # NVCC_THREADS
    build-type = "Release"         # CMAKE_BUILD_TYPE
    ccache = true                  # use ccache when it is installed (default)

    [full.sources]                 # offline copies of what CMake would download
    cutlass = "/srv/src/cutlass"   # paths relative to this file are allowed
    flash-attn = "/srv/src/flash-attention"
    flashmla = "/srv/src/FlashMLA"
    deepgemm = "/srv/src/DeepGEMM"
    qutlass = "/srv/src/qutlass"
    triton-kernels = "/srv/src/triton/python/triton_kernels/triton_kernels"
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

from vllm_fork.errors import UsageError
from vllm_fork.wheel.plan import SOURCE_VARS, FullOptions

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

_KEYS = {"cuda-archs", "rocm-archs", "max-jobs", "nvcc-threads", "build-type", "ccache", "sources"}


def _int(table: dict[str, Any], key: str, where: str) -> int | None:
    value = table.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise UsageError(f"{where}: {key} must be a positive integer")
    return value


def load_full_options(path: Path) -> tuple[FullOptions, bool]:
    """Full-build settings from ``path`` and whether ccache may be used."""
    try:
        data = tomllib.loads(Path(path).read_text())
    except FileNotFoundError:
        raise UsageError(f"build config {path} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"build config {path}: {exc}") from None
    table = data.get("full", {})
    where = f"{path} [full]"
    unknown = sorted(set(table) - _KEYS)
    if unknown:
        raise UsageError(f"{where}: unknown key(s) {', '.join(unknown)}")
    sources: dict[str, Path] = {}
    for name, value in table.get("sources", {}).items():
        if name not in SOURCE_VARS:
            raise UsageError(
                f"{where}.sources: unknown source {name!r} (known: {', '.join(SOURCE_VARS)})"
            )
        p = Path(str(value)).expanduser()
        sources[name] = p if p.is_absolute() else (Path(path).parent / p).resolve()
    texts: dict[str, Any] = {
        attr: str(table[key])
        for key, attr in (
            ("cuda-archs", "cuda_archs"),
            ("rocm-archs", "rocm_archs"),
            ("build-type", "build_type"),
        )
        if key in table
    }
    options = FullOptions(
        sources=sources,
        max_jobs=_int(table, "max-jobs", where),
        nvcc_threads=_int(table, "nvcc-threads", where),
        **texts,
    )
    return options, bool(table.get("ccache", True))


def parse_source_option(text: str) -> tuple[str, Path]:
    """``NAME=DIR`` of ``--source``."""
    name, sep, value = text.partition("=")
    if not sep or name not in SOURCE_VARS or not value:
        raise UsageError(
            f"--source wants NAME=DIR with NAME one of {', '.join(SOURCE_VARS)}, got {text!r}"
        )
    return name, Path(value).expanduser().resolve()


def check_sources(options: FullOptions) -> list[str]:
    return [
        f"source {name} ({SOURCE_VARS[name]}): {path} is not a directory"
        for name, path in sorted(options.sources.items())
        if not Path(path).is_dir()
    ]


def find_ccache() -> str | None:
    return shutil.which("ccache")
