"""Compile the fork's RoPE kernel templates for AMD GPUs with a real hipcc.

No ROCm build of PyTorch is at hand, so the torch extension itself cannot be
built for HIP; its device code can. This takes the kernel file of a vLLM
tree (``csrc/pos_encoding_kernels.cu`` or ``csrc/libtorch_stable/...``),
keeps its device part (the ``vllm`` namespace: vector types, the rotation
and the kernel) and the tree's ``cuda_compat.h``, and adds the smallest
stand-in for the host glue: c10's real ``Half`` and ``BFloat16`` (header-only,
from a PyTorch wheel's include folder) and one host function per
instantiation that launches it, for every query/cache dtype pair and every
vector width the op's dispatch picks (NeoX: 16 bytes of the query and 1;
GPT-J: 16 bytes, 8 bytes and 1, with the flat GPT-J kernel where the file
has it). It compiles that for each ``--arch``
(default gfx942 and gfx950, both wave64) with ``-DUSE_ROCM``, then reads
each code object back: how many rotary kernels it holds and their
wavefront size (``llvm-readelf --notes``).

Exit 0: compiled and checked; 1: the compile or a check failed; 2: bad
usage (no kernel file, no compiler). With ``--chroot DIR`` the compiler is
DIR's (a Debian unstable chroot with hipcc, see docs/hip-compile.md) and
the scratch folder lives in DIR/tmp.
"""

from __future__ import annotations

import argparse
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

DTYPES = {"float": 4, "c10::Half": 2, "c10::BFloat16": 2}
ARCHS = ("gfx942", "gfx950")


def kernel_file(tree: Path) -> Path:
    for rel in ("csrc/pos_encoding_kernels.cu", "csrc/libtorch_stable/pos_encoding_kernels.cu"):
        if (tree / rel).is_file():
            return tree / rel
    raise FileNotFoundError(f"{tree}: no csrc/pos_encoding_kernels.cu")


def compat_header(tree: Path) -> Path:
    for rel in ("csrc/cuda_compat.h", "csrc/core/cuda_compat.h"):
        if (tree / rel).is_file():
            return tree / rel
    raise FileNotFoundError(f"{tree}: no cuda_compat.h")


def device_part(text: str) -> str:
    """The kernel file's ``namespace vllm { ... }`` block (its device code)."""
    start = text.find("namespace vllm {")
    end = text.find("}  // namespace vllm")
    if start < 0 or end < 0:
        raise ValueError("no `namespace vllm { ... }  // namespace vllm` block")
    return text[start : end + len("}  // namespace vllm")]


FLAT = "rotary_embedding_flat_kernel"
# The host code of a kernel file whose NeoX runs the flat kernel with a cache
# wider than the query (issue 41) names it so.
NEOX_FLAT = "rope_flat_blocks<query_t, cache_t, true"


def instantiations(
    flat: bool = False, neox_flat: bool = False
) -> list[tuple[str, str, bool, int, bool]]:
    """(query, cache, is_neox, VEC, flat) for every kernel the dispatch
    launches; with ``flat`` (a kernel file that has the flat GPT-J kernel)
    GPT-J launches that one instead of the block kernel, and with
    ``neox_flat`` NeoX with a cache wider than the query (16 bytes of the
    query) may launch the flat kernel too."""
    out = []
    for q, qsize in DTYPES.items():
        vec = 16 // qsize
        for c, csize in DTYPES.items():
            for v in (vec, 1):
                out.append((q, c, True, v, False))
            if neox_flat and csize > qsize:
                out.append((q, c, True, vec, True))
            for v in (vec, vec // 2, 1):
                out.append((q, c, False, v, flat))
    return out


HIPIFY = """
import sys
from torch.utils.hipify import hipify_python
hipify_python.hipify(project_directory=sys.argv[1], output_directory=sys.argv[1],
                     includes=[sys.argv[1] + "/csrc/*"], show_detailed=False,
                     is_pytorch_extension=True)
"""


def hipify(tree: Path, python: str, work: Path) -> tuple[str, str, Path]:
    """PyTorch's hipify (as a ROCm build runs it) over copies of the kernel
    file and its cuda_compat.h: (hipified kernel text, the compat header's
    include name in it, the hipified header)."""
    kernel, compat = kernel_file(tree), compat_header(tree)
    base = kernel.parent
    dest = work / "hipify"
    shutil.rmtree(dest, ignore_errors=True)
    (dest / "csrc").mkdir(parents=True)
    shutil.copy(kernel, dest / "csrc" / kernel.name)
    rel = compat.relative_to(base) if compat.is_relative_to(base) else Path(compat.name)
    if not compat.is_relative_to(base):  # csrc/core/ beside csrc/libtorch_stable/
        rel = Path(compat.parent.name) / compat.name
    (dest / "csrc" / rel).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(compat, dest / "csrc" / rel)
    subprocess.run([python, "-c", HIPIFY, str(dest)], check=True, capture_output=True)
    hip = sorted((dest / "csrc").glob("pos_encoding_kernels*.hip"))
    if not hip:
        raise ValueError("hipify wrote no .hip file")
    text = hip[0].read_text()
    m = re.search(r'#include "([^"]*compat[^"]*)"', text)
    if not m:
        raise ValueError("no compat header include in the hipified kernel")
    header = dest / "csrc" / m.group(1)
    if not header.is_file():
        raise ValueError(f"hipify left no {m.group(1)}")
    return text, m.group(1), header


def source(kernel_text: str, compat_include: str, origin: str) -> str:
    body = device_part(kernel_text)
    lines = [
        "// Generated by bench/hip/compile_rope.py: the device part of the",
        f"// fork's {origin} after PyTorch's hipify, and host stand-ins.",
        "#include <hip/hip_runtime.h>",
        "#include <c10/util/BFloat16.h>",
        "#include <c10/util/Half.h>",
        "#include <algorithm>",
        "#include <cstdint>",
        "#include <limits>",
        "#include <type_traits>",
        f'#include "{compat_include}"',
        "",
        body,
        "",
        "// Host stand-in: one launcher per instantiation, as the op's dispatch",
        "// launches it (grid and block from the caller).",
    ]
    for i, (q, c, neox, v, flat) in enumerate(
        instantiations(FLAT in body, NEOX_FLAT in kernel_text)
    ):
        if flat:
            lines += [
                f"void rope_launch_{i}(dim3 grid, dim3 block, hipStream_t stream,",
                f"    const int64_t* pos, {q}* query, {q}* key, const {c}* cache) {{",
                f"  vllm::{FLAT}<{q}, {c}, {str(neox).lower()}, {v}>",
                "      <<<grid, block, 0, stream>>>(pos, query, key, cache, 64, 3072,",
                "          576, 192, 16, 1, 4096,",
                f"          vllm::RopeDivisor(17 * 32 / {v}), vllm::RopeDivisor(32 / {v}),",
                "          128, false);",
                "}",
            ]
            continue
        lines += [
            f"void rope_launch_{i}(dim3 grid, dim3 block, hipStream_t stream,",
            f"    const int64_t* pos, {q}* query, {q}* key, const {c}* cache) {{",
            f"  vllm::rotary_embedding_kernel<{q}, {c}, {str(neox).lower()}, {v}>",
            "      <<<grid, block, 0, stream>>>(pos, query, key, cache, 128, 4096,",
            "                                   1024, 128, 32, 40, 1, 1, 1, 0, false);",
            "}",
        ]
    return "\n".join(lines) + "\n"


def run(cmd: list[str], log: list[str]) -> subprocess.CompletedProcess:
    log.append("$ " + shlex.join(cmd))
    r = subprocess.run(cmd, capture_output=True, text=True)
    out = (r.stdout + r.stderr).strip()
    if out:
        log.append(out)
    return r


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", type=Path, required=True, help="a vLLM source tree of the fork")
    ap.add_argument("--chroot", type=Path, help="run hipcc inside this chroot")
    ap.add_argument("--hipcc", default="hipcc", help="compiler (inside the chroot if given)")
    ap.add_argument("--readelf", default="llvm-readelf-21", help="llvm-readelf (likewise)")
    ap.add_argument(
        "--torch-include", type=Path, required=True, help="a PyTorch wheel's include folder"
    )
    ap.add_argument("--python", default=sys.executable, help="a Python with PyTorch (hipify)")
    ap.add_argument("--arch", action="append", help="offload arch (default gfx942, gfx950)")
    ap.add_argument("--log", type=Path, help="write the compile log here too")
    args = ap.parse_args()
    archs = args.arch or list(ARCHS)
    if args.chroot:
        inside = Path("/tmp/vllm-fork-compile-rope")
        work = args.chroot / inside.relative_to("/")
        prefix = ["chroot", str(args.chroot)]
        found = (args.chroot / "usr/bin" / args.hipcc).exists()
    else:
        inside = work = Path("/tmp/vllm-fork-compile-rope")
        prefix = []
        found = shutil.which(args.hipcc) is not None
    if not found:
        print(f"compile_rope: error: {args.hipcc} not found", file=sys.stderr)
        return 2
    if not (args.torch_include / "c10/util/Half.h").is_file():
        print(f"compile_rope: error: {args.torch_include} has no c10/util/Half.h", file=sys.stderr)
        return 2
    shutil.rmtree(work, ignore_errors=True)
    (work / "include").mkdir(parents=True)
    try:
        text, compat_include, header = hipify(args.tree, args.python, work)
        src = source(text, compat_include, str(kernel_file(args.tree).relative_to(args.tree)))
    except (FileNotFoundError, ValueError) as e:
        print(f"compile_rope: error: {e}", file=sys.stderr)
        return 2
    except subprocess.CalledProcessError as e:
        print(f"compile_rope: error: hipify failed: {e.stderr.strip()[-300:]}", file=sys.stderr)
        return 2
    # c10's Half and BFloat16 are header-only; they include torch/headeronly.
    for sub in ("c10", "torch/headeronly"):
        if (args.torch_include / sub).is_dir():
            shutil.copytree(args.torch_include / sub, work / "include" / sub)
    (work / "rope_hip.hip").write_text(src)
    (work / compat_include).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(header, work / compat_include)
    log: list[str] = [f"kernel: {kernel_file(args.tree)}"]
    expected = len(instantiations(FLAT in device_part(text), NEOX_FLAT in text))
    ok = True
    run(prefix + [args.hipcc, "--version"], log)
    for arch in archs:
        obj = inside / f"rope_hip-{arch}.co"
        t0 = time.time()
        r = run(
            prefix
            + [
                args.hipcc,
                "-x",
                "hip",
                "-std=c++17",
                "-O3",
                "-DUSE_ROCM",
                f"--offload-arch={arch}",
                "--offload-device-only",
                "--no-gpu-bundle-output",
                "-I",
                str(inside),
                "-I",
                str(inside / "include"),
                str(inside / "rope_hip.hip"),
                "-o",
                str(obj),
            ],
            log,
        )
        log.append(f"{arch}: exit {r.returncode} in {time.time() - t0:.1f} s")
        if r.returncode != 0:
            ok = False
            continue
        notes = subprocess.run(
            prefix + [args.readelf, "--notes", str(obj)], capture_output=True, text=True
        )
        kernels = re.findall(r"\.name:\s+(\S*rotary_embedding_(?:flat_)?kernel\S*)", notes.stdout)
        waves = set(re.findall(r"\.wavefront_size:\s+(\d+)", notes.stdout))
        flat = sum(FLAT in k for k in kernels)
        log.append(
            f"{arch}: {len(kernels)} rotary kernels (expected {expected}), "
            f"wavefront size {', '.join(sorted(waves)) or '?'}"
            + (f"; {flat} of them the flat kernel" if flat else "")
        )
        if len(kernels) != expected or waves != {"64"}:
            ok = False
    text = "\n".join(log) + "\n" + ("OK\n" if ok else "FAILED\n")
    print(text, end="")
    if args.log:
        args.log.write_text(text)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
