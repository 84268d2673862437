"""Build and load builds of vLLM's csrc/pos_encoding_kernels.cu as extensions.

Each variant is one copy of the kernel file plus the two csrc headers it
includes, laid out as ``<src_root>/<variant>/csrc/``. Each build registers
the op as ``torch.ops.<namespace>.rotary_embedding`` with vLLM's schema; the
kernel file's host function and its ``vllm`` namespace are renamed per build
so that the builds can live in one process.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
VARIANTS = ("fork-0.20.0", "pristine-0.20.0", "pristine-0.21.0")


def namespace(variant: str) -> str:
    """Operator namespace of a variant: ``rope_fork_0_20_0``."""
    return "rope_" + re.sub(r"[^0-9A-Za-z]", "_", variant)


def _build_args(variant: str, src_root: Path, build_root: Path) -> dict:
    csrc = src_root / variant / "csrc"
    kernel = csrc / "pos_encoding_kernels.cu"
    if not kernel.is_file():
        raise FileNotFoundError(f"{kernel} is missing (run prepare.sh first)")
    ns = namespace(variant)
    renames = [
        f"-DROPE_NS={ns}",
        f"-Drotary_embedding=rotary_embedding_{ns}",
        f"-Dvllm=vllm_{ns}",
    ]
    build_dir = build_root / variant
    build_dir.mkdir(parents=True, exist_ok=True)
    return dict(
        name=ns,
        sources=[str(HERE / "binding.cpp"), str(kernel)],
        extra_include_paths=[str(csrc)],
        extra_cflags=["-O3", *renames],
        # vLLM builds its kernels with the half/bf16 operators enabled.
        extra_cuda_cflags=[
            "-O3",
            "--expt-relaxed-constexpr",
            "-U__CUDA_NO_HALF_OPERATORS__",
            "-U__CUDA_NO_HALF_CONVERSIONS__",
            "-U__CUDA_NO_BFLOAT16_OPERATORS__",
            "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
            "-U__CUDA_NO_HALF2_OPERATORS__",
            *renames,
        ],
        build_directory=str(build_dir),
        is_python_module=False,
        verbose=False,
    )


def load(variant: str, src_root: Path, build_root: Path) -> Callable[..., None]:
    """Build (or reuse an up-to-date build of) one variant and return its op."""
    import torch
    from torch.utils.cpp_extension import load as load_extension

    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0")
    load_extension(**_build_args(variant, src_root, build_root))
    return getattr(torch.ops, namespace(variant)).rotary_embedding


def _build_only(variant: str, src_root: str, build_root: str) -> str:
    load(variant, Path(src_root), Path(build_root))
    return variant


def build_all(variants: tuple[str, ...], src_root: Path, build_root: Path) -> None:
    """Build the variants in parallel, one process each."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(len(variants), mp_context=ctx) as pool:
        futures = [pool.submit(_build_only, v, str(src_root), str(build_root)) for v in variants]
        for future in futures:
            future.result()
