"""The fork's RoPE kernel compiles for AMD GPUs with a real hipcc.

Builds the kernel file of a base (upstream's file with the series' kernel
patch applied) through bench/hip/compile_rope.py: PyTorch's hipify, then
hipcc for gfx942 and gfx950, every instantiation the dispatch launches, each
code object read back (kernel count, wavefront size 64). Runs where the
compiler is: ``VLLM_FORK_HIP_CHROOT`` (a Debian unstable chroot with hipcc,
docs/hip-compile.md) or ``hipcc`` on PATH, with a PyTorch include folder and
a Python with PyTorch (for hipify): ``VLLM_FORK_TORCH_PYTHON``. Where any
of them is missing the test is skipped and says which.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_fork.series.patches import load_series

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "hip" / "compile_rope.py"
BASES = ("0.21.0", "0.20.0", "0.33.0")  # C++ API, cache-dtype lambda, stable ABI

pytestmark = pytest.mark.network


def _compiler() -> list[str]:
    root = os.environ.get("VLLM_FORK_HIP_CHROOT")
    if root:
        if not (Path(root) / "usr/bin/hipcc").exists():
            pytest.skip(f"no hipcc in VLLM_FORK_HIP_CHROOT={root} (docs/hip-compile.md)")
        return ["--chroot", root]
    if shutil.which("hipcc") is None:
        pytest.skip(
            "no HIP compiler here: hipcc is not on PATH and VLLM_FORK_HIP_CHROOT is "
            "unset (docs/hip-compile.md makes one)"
        )
    return []


def _torch_python() -> tuple[str, Path]:
    python = os.environ.get("VLLM_FORK_TORCH_PYTHON")
    if not python:
        pytest.skip("VLLM_FORK_TORCH_PYTHON is unset: a Python with PyTorch runs hipify")
    r = subprocess.run(
        [python, "-c", "import torch, os; print(os.path.dirname(torch.__file__))"],
        capture_output=True,
        text=True,
    )
    if r.returncode != 0:
        pytest.skip(f"VLLM_FORK_TORCH_PYTHON={python} cannot import torch")
    return python, Path(r.stdout.strip()) / "include"


def _kernel_tree(upstream_source, version: str, dest: Path) -> Path:
    """Upstream's kernel file and compat header with the series' patches to
    the kernel file applied in order (0.20.x: the cache-dtype backport, then
    the kernel)."""
    tree = upstream_source(version)
    patches = [
        p
        for p in load_series(ROOT / "series" / version, validate=False).patches
        if "pos_encoding_kernels.cu b/" in p.read_text()
    ]
    assert any("Vectorize-the-rotary-embedding" in p.name for p in patches)
    for rel in (
        "csrc/pos_encoding_kernels.cu",
        "csrc/libtorch_stable/pos_encoding_kernels.cu",
        "csrc/cuda_compat.h",
        "csrc/core/cuda_compat.h",
    ):
        text = tree.read_text(rel)
        if text is not None:
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            (dest / rel).write_text(text)
    for patch in patches:
        subprocess.run(
            ["git", "apply", "--include=*pos_encoding_kernels.cu", str(patch)],
            cwd=dest,
            check=True,
        )
    return dest


@pytest.mark.parametrize("version", BASES)
def test_rope_kernel_compiles_for_gfx942_and_gfx950(
    upstream_source, tmp_path: Path, version: str
) -> None:
    where = _compiler()
    python, include = _torch_python()
    tree = _kernel_tree(upstream_source, version, tmp_path / "tree")
    log = tmp_path / "compile.log"
    r = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--tree",
            str(tree),
            *where,
            "--python",
            python,
            "--torch-include",
            str(include),
            "--log",
            str(log),
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    text = log.read_text()
    for arch in ("gfx942", "gfx950"):
        assert f"{arch}: 47 rotary kernels (expected 47), wavefront size 64" in text
