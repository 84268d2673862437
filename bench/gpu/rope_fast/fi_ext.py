"""Build FlashInfer's rope (flashinfer_binding.cu) as a torch extension.

The include folder is the one prepare.sh staged from a pinned wheel
(ROPE_FI_INCLUDE, or the folder given to load()); each version is built
under its own operator namespace (``torch.ops.<name>.apply``), so that two
versions can be timed in one process.
"""

from __future__ import annotations

import os
from pathlib import Path

HERE = Path(__file__).resolve().parent


def load(build_root: Path, include: Path | None = None, name: str = "rope_flashinfer") -> None:
    import torch  # noqa: F401
    from torch.utils.cpp_extension import load as load_extension

    include = include or Path(os.environ["ROPE_FI_INCLUDE"])
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0")
    build = build_root / name
    build.mkdir(parents=True, exist_ok=True)
    load_extension(
        name=name,
        sources=[str(HERE / "flashinfer_binding.cu")],
        extra_include_paths=[str(HERE / "fi_stub"), str(include)],
        extra_cflags=["-O3", f"-DROPE_FI_NS={name}"],
        extra_cuda_cflags=[
            "-O3",
            f"-DROPE_FI_NS={name}",
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
