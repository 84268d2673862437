"""Time the fork's RoPE kernel against upstream's and FlashInfer's (issue 18).

In one process on one GPU:

1. bit-identity of the fork's build against upstream's build of
   csrc/pos_encoding_kernels.cu over a matrix of cases (NeoX/GPT-J, partial
   rotary, rope_dim_offset, inverse, odd head sizes, strided fused-qkv views,
   key=None, [B, S] positions, every query/cache dtype pair);
2. an empty batch through each op, each in its own subprocess (a crash there
   must not end the benchmark);
3. the device-to-device copy bandwidth, and per case the time of upstream's
   kernel, the fork's, FlashInfer's (0.7.4, the peer, and 0.7.2 where its
   headers are given; float32 cache, as it requires), an
   in-place scale of the same q and k, and two touches (probe.cu) of only
   the rotated bytes of q and k, each as the median of 7 replays of a CUDA
   graph of 20 calls (the replays of the ops interleaved), against the
   floor = bytes that must move / that bandwidth.

Writes results.md and results.json to --out; ``ROPE_BENCH_ROWS=small``
writes small.md, small.json and, beside a results.json of the same out
folder, targets.md (issue 41's targets, the launch-bound rows judged by
their medians over the rounds). ``--dry-run`` checks the script on the CPU
with PyTorch stand-ins for the ops (no builds, no times).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "rope_cache_dtype"))
import rope_ext  # noqa: E402  (the variant builder of the cache-dtype bench)

UPSTREAM, FORK = "upstream-0.21.0", "fork-0.21.0"
# Further staged builds to time beside the fork's (kernel design trials).
EXTRA = [v for v in os.environ.get("ROPE_EXTRA_VARIANTS", "").split(",") if v]
# ROPE_BENCH_ROWS=layouts times only the GPT-J rows (the GPT-J variant row
# and the model-shaped layout classes): a shorter run for GPT-J trials.
# ROPE_BENCH_ROWS=small times the launch-bound layout rows (<= 1024 tokens)
# ROPE_BENCH_ROUNDS times over (default 9), each round a fresh set of
# interleaved replays, and reports the spread of fork/FlashInfer.
ROWS = os.environ.get("ROPE_BENCH_ROWS", "all")
ONLY_GPTJ = ROWS == "layouts"
SMALL_TOKENS = 1024
F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32
NUM_Q_HEADS, NUM_KV_HEADS, MAX_POSITION = 32, 8, 131072
TOKENS = (1, 256, 4096, 16384, 65536)
HEADS = (64, 128, 256)
CALLS, REPEATS = 20, 7
# The touches (probe.cu): 512-thread blocks; 1 = one 16-byte piece per
# thread in address order, 0 = each thread its x and y pieces (NeoX order).
TOUCH_THREADS = 512
TOUCHES = {"touch": 1, "touch_neox": 0}
# name: (query dtype, cache dtype, is_neox, rot_dim / head_size) at 16384 x 128.
VARIANTS = {
    "fp16": (F16, F16, True, 1.0),
    "gptj": (BF16, BF16, False, 1.0),
    "partial-rotary (rot 64)": (BF16, BF16, True, 0.5),
    "fp32-cache": (BF16, F32, True, 1.0),
}

# Model-shaped layout classes (issues 30 and 41), each at these token counts
# (12345: a count that is no multiple of any block or slice size):
# name: (q heads, kv heads, head_size, rot_dim, is_neox, cache dtype, layout).
#   mla: DeepSeek-V3 MLA rope: q_pe is the last 64 of every 192-wide query
#        head ([T, H, 192][..., 128:]), k_pe the last 64 of the 576-wide
#        compressed kv row ([T, 576][:, 512:], one head); GPT-J style, the
#        cache in the model dtype. 16 heads = TP8, 128 heads = TP1.
#   fused: q and k as views of the fused qkv projection ([T, (q + 2 kv)
#        heads x head]): GLM-4's GPT-J partial rotary (rot 64 of 128, 32/2
#        heads), and GPT-OSS's NeoX (64/8 heads of 64, float32 cache).
#   flat: q and k contiguous [T, heads x head]: Llama-3-8B's NeoX, 32/8
#        heads of 128, full rotary.
LAYOUT_TOKENS = (1, 8, 64, 1024, 4096, 12288, 12345, 32768)
LAYOUTS = {
    "MLA TP8": (16, 1, 64, 64, False, BF16, "mla"),
    "MLA TP1": (128, 1, 64, 64, False, BF16, "mla"),
    "GPT-J partial": (32, 2, 128, 64, False, BF16, "fused"),
    "NeoX full": (32, 8, 128, 128, True, BF16, "flat"),
    "NeoX fused-qkv": (64, 8, 64, 64, True, F32, "fused"),
}
# FlashInfer builds: the peer (0.7.4) under "flashinfer", the older pinned
# version (0.7.2) beside it where its headers are given.
FI_PEER, FI_SECOND = "flashinfer", "flashinfer-0.7.2"
FI_NAMESPACES = {FI_PEER: "rope_flashinfer", FI_SECOND: "rope_flashinfer_0_7_2"}

Op = Callable[..., None]
# Where the timed cases put their tensors (the CPU in --dry-run).
DEVICE = "cuda"


def short(dtype: torch.dtype) -> str:
    return {F16: "fp16", BF16: "bf16", F32: "fp32"}[dtype]


def reference_op(positions, query, key, head_size, cache, is_neox, offset=0, inverse=False):
    """CPU stand-in for the op in --dry-run (float32 math, like the kernel)."""
    if positions.numel() == 0:
        return
    rot_dim = cache.size(1)
    half = rot_dim // 2
    cos_sin = cache.float()[positions.flatten()]
    cos, sin = cos_sin[:, None, :half], cos_sin[:, None, half:]
    if inverse:
        sin = -sin
    for x in (query, key):
        if x is None:
            continue
        flat = x if x.dim() == 3 else x.view(positions.numel(), -1, head_size)
        rot = flat[..., offset : offset + rot_dim].float()
        if is_neox:
            a, b = rot[..., :half].clone(), rot[..., half:].clone()
            rot[..., :half], rot[..., half:] = a * cos - b * sin, b * cos + a * sin
        else:
            a, b = rot[..., 0::2].clone(), rot[..., 1::2].clone()
            rot[..., 0::2], rot[..., 1::2] = a * cos - b * sin, b * cos + a * sin
        flat[..., offset : offset + rot_dim] = rot.to(x.dtype)


def rope_cache(rot_dim: int, dtype: torch.dtype, device: str, rows: int = MAX_POSITION):
    inv_freq = 1.0 / (10000 ** (torch.arange(0, rot_dim, 2, device=device) / rot_dim))
    freqs = torch.arange(rows, device=device, dtype=torch.float32)[:, None] * inv_freq
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1).to(dtype)


# ---------------------------------------------------------------- identity
def identity_cases() -> list[dict]:
    cases = []
    pairs = [(q, c) for q in (F16, BF16, F32) for c in (F16, BF16, F32)]
    for qd, cd in pairs:
        for neox in (True, False):
            for head, rot, off in (
                (128, 128, 0),
                (128, 64, 0),
                (128, 64, 64),
                (64, 32, 16),
                (80, 80, 0),
                (96, 64, 8),
                (256, 256, 0),
                (512, 128, 0),
                (128, 30, 2),
                (640, 522, 2),
            ):
                cases.append(
                    dict(
                        q=qd,
                        c=cd,
                        neox=neox,
                        head=head,
                        rot=rot,
                        off=off,
                        inverse=(head + rot) % 3 == 0,
                        tokens=37,
                        layout="flat",
                    )
                )
    for layout in ("flat", "heads", "fused-qkv", "no-key", "batch", "misaligned"):
        for neox in (True, False):
            for tokens in (1, 7, 256, 4097, 65536):
                cases.append(
                    dict(
                        q=BF16,
                        c=BF16,
                        neox=neox,
                        head=128,
                        rot=128,
                        off=0,
                        inverse=tokens == 7,
                        tokens=tokens,
                        layout=layout,
                    )
                )
    # The model-shaped views of issue 30: MLA q_pe/k_pe, GPT-J partial
    # rotary on a fused qkv.
    for tokens in (1, 7, 256, 4097, 65536):
        for neox in (True, False):
            for layout, head, rot in (("mla", 64, 64), ("fused-qkv", 128, 64)):
                cases.append(
                    dict(
                        q=BF16,
                        c=BF16,
                        neox=neox,
                        head=head,
                        rot=rot,
                        off=0,
                        inverse=tokens == 7,
                        tokens=tokens,
                        layout=layout,
                    )
                )
    # A cache wider than the query at sizes past one wave (issue 41: NeoX
    # may run the flat kernel there), both styles, q/k views of a fused qkv.
    for qd in (F16, BF16):
        for tokens in (4097, 65536):
            for neox in (True, False):
                cases.append(
                    dict(
                        q=qd,
                        c=F32,
                        neox=neox,
                        head=64,
                        rot=64,
                        off=0,
                        inverse=tokens == 4097,
                        tokens=tokens,
                        layout="fused-qkv",
                    )
                )
    return cases


def make_inputs(case: dict, device: str, seed: int):
    g = torch.Generator(device=device).manual_seed(seed)
    tokens, head, qd = case["tokens"], case["head"], case["q"]
    hq, hk = 8, 2
    positions = torch.randint(0, 4096, (tokens,), device=device, generator=g)
    cache = (torch.rand(4096, case["rot"], device=device, generator=g) * 2 - 1).to(case["c"])
    layout = case["layout"]
    if layout == "mla":
        q_full = torch.randn(tokens, hq, 192, device=device, generator=g).to(qd)
        kv = torch.randn(tokens, 576, device=device, generator=g).to(qd)
        return positions, q_full[..., 128:], kv[:, 512:].unsqueeze(1), cache
    if layout == "fused-qkv":
        qkv = torch.randn(tokens, (hq + 2 * hk) * head, device=device, generator=g).to(qd)
        q, k = qkv[:, : hq * head], qkv[:, hq * head : (hq + hk) * head]
        return positions, q, k, qkv
    if layout == "misaligned":
        buf = torch.randn(tokens * (hq + hk) * head + 1, device=device, generator=g).to(qd)
        q = buf[1 : 1 + tokens * hq * head].view(tokens, hq * head)
        k = buf[1 + tokens * hq * head :].view(tokens, hk * head)
        return positions, q, k, buf
    q = torch.randn(tokens, hq * head, device=device, generator=g).to(qd)
    k = torch.randn(tokens, hk * head, device=device, generator=g).to(qd)
    if layout == "heads":
        q, k = q.view(tokens, hq, head), k.view(tokens, hk, head)
    if layout == "no-key":
        k = None
    if layout == "batch" and tokens % 7 == 0:
        positions = positions.view(7, -1)
        q, k = q.view(7, tokens // 7, -1), k.view(7, tokens // 7, -1)
    return positions, q, k, cache


def check_identity(ops: dict[str, Op], device: str, against: str = FORK) -> dict:
    upstream, fork = ops[UPSTREAM], ops[against]
    failures, n = [], 0
    for i, case in enumerate(identity_cases()):
        if device == "cpu" and case["tokens"] > 300:
            continue
        outs = []
        for op in (upstream, fork):
            positions, q, k, extra = make_inputs(case, device, seed=i)
            cache = (
                extra
                if case["layout"] not in ("fused-qkv", "misaligned")
                else (
                    torch.rand(
                        4096,
                        case["rot"],
                        device=device,
                        generator=torch.Generator(device=device).manual_seed(i),
                    )
                    * 2
                    - 1
                ).to(case["c"])
            )
            op(positions, q, k, case["head"], cache, case["neox"], case["off"], case["inverse"])
            outs.append((q.clone(), None if k is None else k.clone()))
        n += 1
        (uq, uk), (fq, fk) = outs
        same = torch.equal(uq, fq) and (uk is None or torch.equal(uk, fk))
        if not same:
            failures.append(
                {k2: (short(v) if isinstance(v, torch.dtype) else v) for k2, v in case.items()}
            )
    return {"cases": n, "failures": failures}


# ---------------------------------------------------------------- empty batch
EMPTY_SNIPPET = r"""
import sys, torch
sys.path[:0] = {paths!r}
import rope_ext
from pathlib import Path
name = {name!r}
if name.startswith("flashinfer"):
    import fi_ext
    fi_ext.load(Path({build!r}), Path({include!r}), {namespace!r})
    op = getattr(torch.ops, {namespace!r}).apply
    dt = torch.float32
else:
    op = rope_ext.load(name, Path({src!r}), Path({build!r}))
    dt = torch.bfloat16
p = torch.empty(0, dtype=torch.long, device="cuda")
q = torch.empty(0, 32 * 128, dtype=torch.bfloat16, device="cuda")
k = torch.empty(0, 8 * 128, dtype=torch.bfloat16, device="cuda")
c = torch.rand(16, 128, device="cuda").to(dt)
op(p, q, k, 128, c, True)
torch.cuda.synchronize()
print("returned")
"""


def check_empty(
    names: list[str], src: Path, build: Path, includes: dict[str, Path] | None = None
) -> dict[str, str]:
    out = {}
    for name in names:
        code = EMPTY_SNIPPET.format(
            paths=[str(HERE), str(HERE.parent / "rope_cache_dtype")],
            name=name,
            src=str(src),
            build=str(build),
            include=str((includes or {}).get(name, "")),
            namespace=FI_NAMESPACES.get(name, ""),
        )
        r = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=600
        )
        if r.returncode == 0:
            out[name] = "returned, no error"
        elif r.returncode < 0:
            out[name] = f"killed by signal {-r.returncode}"
        else:
            last = [line for line in r.stderr.splitlines() if line.strip()]
            out[name] = f"exit {r.returncode}: " + (last[-1][:120] if last else "")
    return out


# ---------------------------------------------------------------- timing
def graphs_us(fns: dict[str, Callable[[], None]]) -> dict[str, float]:
    """Per function, us per call: a CUDA graph of CALLS calls each, their
    replays interleaved (REPEATS rounds, one replay of each per round) so
    that a transient slowdown of the GPU hits every function alike; the
    median per function."""
    graphs = {}
    for name, fn in fns.items():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(CALLS):
                fn()
        graph.replay()
        graphs[name] = graph
    torch.cuda.synchronize()
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(REPEATS):
        for name, graph in graphs.items():
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            samples[name].append(start.elapsed_time(end) * 1e3 / CALLS)
    del graphs
    return {name: statistics.median(s) for name, s in samples.items()}


def copy_bandwidth() -> float:
    n = 1 << 30
    src = torch.empty(n, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    samples = []
    for _ in range(3):
        dst.copy_(src)
    for _ in range(REPEATS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(5):
            dst.copy_(src)
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / 1e3 / 5)
    return 2 * n / statistics.median(samples)


def load_probe(build_root: Path) -> None:
    """Build (or reuse) probe.cu: torch.ops.rope_probe.touch."""
    from torch.utils.cpp_extension import load as load_extension

    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0")
    build = build_root / "probe"
    build.mkdir(parents=True, exist_ok=True)
    load_extension(
        name="rope_probe",
        sources=[str(HERE / "probe.cu")],
        extra_cflags=["-O3"],
        extra_cuda_cflags=["-O3"],
        build_directory=str(build),
        is_python_module=False,
        verbose=False,
    )


def touch_op():
    """probe.cu's touch, or in --dry-run a stand-in that checks its shapes."""
    if DEVICE == "cuda":
        return torch.ops.rope_probe.touch

    def stand_in(x, row_bytes, touch_bytes, threads, items):
        nbytes = x.numel() * x.element_size()
        assert x.is_contiguous() and nbytes % row_bytes == 0 and touch_bytes <= row_bytes
        assert touch_bytes % 16 == 0 and (items != 0 or touch_bytes % 32 == 0)

    return stand_in


def time_case(ops, fis, tokens, head, qd, cd, neox, rot, bandwidth) -> dict:
    positions = torch.randint(0, MAX_POSITION, (tokens,), device=DEVICE)
    q = torch.randn(tokens, NUM_Q_HEADS * head, device=DEVICE, dtype=qd)
    k = torch.randn(tokens, NUM_KV_HEADS * head, device=DEVICE, dtype=qd)
    cache = rope_cache(rot, cd, DEVICE)
    cache32 = cache if cd == F32 else rope_cache(rot, F32, DEVICE)
    rows = int(torch.unique(positions).numel())
    elem = q.element_size()
    moved = (
        2 * tokens * (NUM_Q_HEADS + NUM_KV_HEADS) * rot * elem + rows * rot * cache.element_size()
    )
    row = {
        "tokens": tokens,
        "head": head,
        "query": short(qd),
        "cache": short(cd),
        "style": "neox" if neox else "gptj",
        "rot_dim": rot,
        "bytes": moved,
        "floor_us": moved / bandwidth * 1e6,
    }
    fns = {
        name: (lambda op=op: op(positions, q, k, head, cache, neox, 0, False))
        for name, op in ops.items()
    }
    for fname, fi in fis.items():
        fns[fname] = lambda fi=fi: fi(positions, q, k, head, cache32, neox)
    fns["scale"] = lambda: (q.mul_(1.0), k.mul_(1.0))
    # What the memory system gives for the access pattern itself: read and
    # write back only the rotated bytes of each head (no cache rows, no
    # arithmetic), in 16-byte pieces.
    touch = touch_op()
    head_bytes, rot_bytes = head * elem, rot * elem
    for name, items in TOUCHES.items():
        fns[name] = lambda items=items: (
            touch(q, head_bytes, rot_bytes, TOUCH_THREADS, items),
            touch(k, head_bytes, rot_bytes, TOUCH_THREADS, items),
        )
    row.update(graphs_us(fns))
    row["flashinfer_cache"] = "fp32"
    return row


def time_layout(ops, fis, name: str, tokens: int, bandwidth: float) -> dict:
    """One row of a model-shaped layout class (LAYOUTS): q and k are the
    views the model passes; the touch reads and writes back only their
    rotated bytes, in the same rows, in 16-byte pieces."""
    hq, hk, head, rot, neox, cd, layout = LAYOUTS[name]
    positions = torch.randint(0, MAX_POSITION, (tokens,), device=DEVICE)
    cache = rope_cache(rot, cd, DEVICE)
    cache32 = cache if cd == F32 else rope_cache(rot, F32, DEVICE)
    if layout == "mla":
        q_full = torch.randn(tokens, hq, 192, device=DEVICE, dtype=BF16)
        kv = torch.randn(tokens, 576, device=DEVICE, dtype=BF16)
        q, k = q_full[..., 128:], kv[:, 512:].unsqueeze(1)
        # The rotated 128 bytes of every 384-byte q row and 1152-byte kv
        # row: the same pieces as bytes 256.. and 1024.. of those rows.
        touched = [(q_full, 384), (kv, 1152)]
        full = [q_full, kv]
    elif layout == "fused":
        qkv = torch.randn(tokens, (hq + 2 * hk) * head, device=DEVICE, dtype=BF16)
        q, k = qkv[:, : hq * head], qkv[:, hq * head : (hq + hk) * head]
        # The same rotated bytes of q and k heads, in a tensor without v.
        touched = [(torch.randn(tokens, (hq + hk) * head, device=DEVICE, dtype=BF16), head * 2)]
        full = [t for t, _ in touched]
    else:
        q = torch.randn(tokens, hq * head, device=DEVICE, dtype=BF16)
        k = torch.randn(tokens, hk * head, device=DEVICE, dtype=BF16)
        touched = [(q, head * 2), (k, head * 2)]
        full = [q, k]
    rows = int(torch.unique(positions).numel())
    moved = 2 * tokens * (hq + hk) * rot * 2 + rows * rot * cache.element_size()
    row = {
        "layout": name,
        "tokens": tokens,
        "head": head,
        "heads": f"{hq}/{hk}",
        "query": "bf16",
        "cache": short(cd),
        "style": "neox" if neox else "gptj",
        "rot_dim": rot,
        "bytes": moved,
        "floor_us": moved / bandwidth * 1e6,
    }
    fns = {
        v: (lambda op=op: op(positions, q, k, head, cache, neox, 0, False)) for v, op in ops.items()
    }
    for fname, fi in fis.items():
        fns[fname] = lambda fi=fi: fi(positions, q, k, head, cache32, neox)
    fns["scale"] = lambda: [t.mul_(1.0) for t in full]
    probe = touch_op()
    for tname, items in TOUCHES.items():
        fns[tname] = lambda items=items: [
            probe(t, row_bytes, rot * 2, TOUCH_THREADS, items) for t, row_bytes in touched
        ]
    row.update(graphs_us(fns))
    row["flashinfer_cache"] = "fp32"
    return row


def fi2(r: dict) -> str:
    """The row's FlashInfer 0.7.2 time, or a dash where it was not timed."""
    return f"{r[FI_SECOND]:.2f}" if FI_SECOND in r else "-"


def layout_markdown(res: dict) -> list[str]:
    """The layout classes: the four ratios per row, then the targets of
    issues 30 and 41 as this run measured them."""
    rows = res.get("layouts", [])
    if not rows:
        return []
    lines = [
        "",
        "## Model-shaped layout classes (issues 30 and 41)",
        "",
        "MLA = DeepSeek-V3 q_pe/k_pe views (64 rotated of every 192-wide q head, "
        "one 64-wide k_pe head in the 576-wide kv row), GPT-J style, bf16 cache; "
        "GPT-J partial = GLM-4-style q/k views of a fused qkv, rot 64 of 128; "
        "NeoX full = Llama-3-8B-style contiguous q and k, 32/8 heads of 128, bf16 "
        "cache; NeoX fused-qkv = GPT-OSS-style q/k views of a fused qkv, 64/8 heads "
        "of 64, float32 cache. FI = FlashInfer 0.7.4 (the peer), FI 0.7.2 beside it. "
        "touch = reading and writing back only the rotated bytes of the same rows.",
        "",
        "| layout | q/kv heads | tokens | upstream us | fork us | FI 0.7.4 us | FI 0.7.2 us "
        "| touch us | floor us | fork/FI | fork/upstream | fork/floor | fork/touch |"
        + "".join(f" {v} us | {v}/FI | {v}/touch |" for v in EXTRA),
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|" + "---|---|---|" * len(EXTRA),
    ]
    for r in rows:
        lines.append(
            f"| {r['layout']} | {r['heads']} | {r['tokens']} | {r[UPSTREAM]:.2f} | "
            f"{r[FORK]:.2f} | {r[FI_PEER]:.2f} | {fi2(r)} | {r['touch']:.2f} | "
            f"{r['floor_us']:.2f} | {r[FORK] / r[FI_PEER]:.3f} | "
            f"{r[FORK] / r[UPSTREAM]:.3f} | {r[FORK] / r['floor_us']:.3f} | "
            f"{r[FORK] / r['touch']:.3f} |"
            + "".join(
                f" {r[v]:.2f} | {r[v] / r[FI_PEER]:.3f} | {r[v] / r['touch']:.3f} |"
                for v in EXTRA
                if v in r
            )
        )
    lines += ["", "Targets (issues 30 and 41; rows of <= 1024 tokens: see small.md):", ""]
    lines += [f"- {t}" for t in row_targets(rows)]
    return lines


def row_targets(rows: list[dict], small: dict | None = None) -> list[str]:
    """Per row: fork <= FlashInfer 0.7.4 and <= upstream, and at >= 12288
    tokens of a layout class fork <= 1.05x the touch. ``small`` maps (name,
    tokens) to the medians over the rounds of a launch-bound row, which
    then stand in for the single timing."""
    out = []
    for r in rows:
        name = r.get("layout") or (
            f"bench head {r['head']} {r['query']}/{r['cache']} {r['style']} rot {r['rot_dim']}"
        )
        key = (name, r["tokens"]) if "layout" in r else (small_name(r), r["tokens"])
        med = (small or {}).get(key)
        fork, fi, up = (med or r)[FORK], (med or r)[FI_PEER], (med or r)[UPSTREAM]
        how = f" (medians of {med['rounds']} rounds)" if med else ""
        checks = [
            (fork <= fi, f"fork {fork:.2f} <= FI 0.7.4 {fi:.2f}"),
            (fork <= up, f"fork <= upstream {up:.2f}"),
        ]
        if "layout" in r and r["tokens"] >= 12288:
            ratio = r[FORK] / r["touch"]
            checks.append((ratio <= 1.05, f"fork/touch {ratio:.3f} <= 1.05"))
        ok = all(c for c, _ in checks)
        out.append(
            f"{'met' if ok else 'MISSED'}: {name} x {r['tokens']}{how}: "
            + "; ".join(t for _, t in checks)
        )
    return out


def small_name(r: dict) -> str:
    """The name of a row in the rounds of small.json."""
    return r.get("layout") or f"bench {r['head']} {r['query']}/{r['cache']} {r['style']}"


def small_markdown(rows: list[dict], header: bool = True) -> str:
    """The launch-bound rows timed round after round: per row the medians
    over the rounds and the spread of fork/FlashInfer 0.7.4."""
    lines = []
    if header:
        cols = [
            "layout", "tokens", "rounds", "fork us", "FI 0.7.4 us", "FI 0.7.2 us",
            "upstream us", "fork/FI median", "fork/FI min", "fork/FI max",
            "rounds fork <= FI", *(f"{v}/FI median" for v in EXTRA),
        ]  # fmt: skip
        lines += ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for row in rows:
        runs = row["runs"]
        ratio = [r[FORK] / r[FI_PEER] for r in runs]
        extra = [statistics.median(r[v] / r[FI_PEER] for r in runs) for v in EXTRA]
        second = (
            f"{statistics.median(r[FI_SECOND] for r in runs):.2f}" if FI_SECOND in runs[0] else "-"
        )
        cells = [
            row["layout"],
            str(row["tokens"]),
            str(len(runs)),
            f"{statistics.median(r[FORK] for r in runs):.2f}",
            f"{statistics.median(r[FI_PEER] for r in runs):.2f}",
            second,
            f"{statistics.median(r[UPSTREAM] for r in runs):.2f}",
            f"{statistics.median(ratio):.3f}",
            f"{min(ratio):.3f}",
            f"{max(ratio):.3f}",
            str(sum(x <= 1 for x in ratio)),
            *(f"{x:.3f}" for x in extra),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def small_medians(small: list[dict]) -> dict:
    """(name, tokens) -> the medians over the rounds of fork, FI, upstream."""
    out = {}
    for row in small:
        runs = row["runs"]
        med = {k: statistics.median(r[k] for r in runs) for k in (FORK, FI_PEER, UPSTREAM)}
        med["rounds"] = len(runs)
        out[(row["layout"], row["tokens"])] = med
    return out


def targets_markdown(full: dict, small: list[dict]) -> str:
    """Issue 41's targets over one run: every row of the benchmark and of the
    layout classes, the launch-bound ones (<= 1024 tokens) by their medians
    over the rounds."""
    med = small_medians(small)
    rows = [*full.get("perf", []), *full.get("layouts", [])]
    lines = [
        "# Issue 41 targets",
        "",
        f"{full['device']}; fork <= FlashInfer 0.7.4 on every row (rows of <= "
        f"{SMALL_TOKENS} tokens: medians of the rounds of small.md), and at >= 12288 "
        "tokens of a layout class fork <= 1.05x the touch.",
        "",
    ]
    res = row_targets(rows, med)
    lines += [f"- {t}" for t in res]
    missed = sum(t.startswith("MISSED") for t in res)
    lines += ["", f"{len(res) - missed} of {len(res)} rows met, {missed} missed."]
    return "\n".join(lines) + "\n"


def floor_target(r: dict) -> float | None:
    """The issue's bound on fork/floor for a row, None where it sets none."""
    if r["tokens"] < 16384:
        return None
    return 1.10 if r["head"] == 64 else 1.05


def targets(perf: list[dict]) -> list[str]:
    """One line per target of the issue: met or missed, with the numbers."""
    out = []
    for r in perf:
        name = (
            f"{r['head']} x {r['tokens']} {r['query']}/{r['cache']} {r['style']} rot {r['rot_dim']}"
        )
        checks = [
            (r[FORK] <= r["flashinfer"], f"fork {r[FORK]:.2f} <= FlashInfer {r['flashinfer']:.2f}"),
            (r[FORK] <= r[UPSTREAM], f"fork <= upstream {r[UPSTREAM]:.2f}"),
        ]
        bound = floor_target(r)
        if bound is not None:
            ratio = r[FORK] / r["floor_us"]
            checks.append((ratio <= bound, f"fork/floor {ratio:.3f} <= {bound:.2f}"))
        ok = all(c for c, _ in checks)
        missed = [t for c, t in checks if not c]
        note = ""
        if bound is not None and r[FORK] / r["floor_us"] > bound and "touch" in r:
            note = (
                f"; touching the rotated bytes alone takes {r['touch']:.2f} us"
                f" = {r['touch'] / r['floor_us']:.3f}x the floor"
            )
        out.append(
            f"{'met' if ok else 'MISSED'}: {name}: "
            + "; ".join(t for _, t in checks)
            + (f" (missed: {'; '.join(missed)}{note})" if missed else "")
        )
    return out


def markdown(res: dict) -> str:
    lines = [
        f"# RoPE kernels on {res['device']}",
        "",
        f"torch {res['torch']}, CUDA {res['cuda']}; {NUM_Q_HEADS} q heads, {NUM_KV_HEADS} "
        f"kv heads, cache {MAX_POSITION} rows; CUDA graph of {CALLS} calls, median of "
        f"{REPEATS} replays; copy bandwidth {res['bandwidth'] / 1e12:.3f} TB/s; floor = "
        "rotated q+k bytes read and written + cache rows used, at that bandwidth. "
        "FlashInfer (FI: 0.7.4, the peer; 0.7.2 beside it) reads a float32 cache "
        "(its only option). touch = reading and "
        "writing back in place only the rotated bytes of q and k, in 16-byte pieces, "
        f"one per thread in address order ({TOUCH_THREADS}-thread blocks); NeoX touch "
        "= the same, each thread its x and y pieces as a NeoX kernel reads them; "
        "neither reads cache rows (probe.cu).",
        "",
        "| head | tokens | query | cache | style | rot | upstream us | fork us | "
        "FI 0.7.4 us | FI 0.7.2 us | scale us | touch us | NeoX touch us | floor us | "
        "fork/floor | touch/floor | fork/touch | fork/FI | fork/upstream |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in res["perf"]:
        lines.append(
            f"| {r['head']} | {r['tokens']} | {r['query']} | {r['cache']} | {r['style']} | "
            f"{r['rot_dim']} | {r[UPSTREAM]:.2f} | {r[FORK]:.2f} | {r['flashinfer']:.2f} | "
            f"{fi2(r)} | {r['scale']:.2f} | {r['touch']:.2f} | {r['touch_neox']:.2f} | "
            f"{r['floor_us']:.2f} | {r[FORK] / r['floor_us']:.3f} | "
            f"{r['touch'] / r['floor_us']:.3f} | {r[FORK] / r['touch']:.3f} | "
            f"{r[FORK] / r['flashinfer']:.3f} | {r[FORK] / r[UPSTREAM]:.3f} |"
            + "".join(f" {v} {r[v]:.2f} |" for v in EXTRA if v in r)
        )
    lines += ["", "Targets (issue 18):", ""]
    lines += [f"- {t}" for t in targets(res["perf"])]
    ident = res["identity"]
    lines += [
        "",
        f"Bit-identity fork vs upstream: {ident['cases'] - len(ident['failures'])}"
        f"/{ident['cases']} cases identical.",
    ]
    for f in ident["failures"][:20]:
        lines.append(f"- DIFFERS: {f}")
    for v, ident_v in res.get("identity_extra", {}).items():
        lines.append(
            f"Bit-identity {v} vs upstream: {ident_v['cases'] - len(ident_v['failures'])}"
            f"/{ident_v['cases']} cases identical."
        )
    lines += ["", "| empty batch | result |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in res["empty"].items()]
    lines += layout_markdown(res)
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", type=Path, required=True, help="staged variant sources")
    ap.add_argument(
        "--flashinfer-include", type=Path, required=True, help="FlashInfer 0.7.4's include folder"
    )
    ap.add_argument(
        "--flashinfer-include-2", type=Path, help="FlashInfer 0.7.2's (a second column)"
    )
    ap.add_argument("--build", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)

    if args.dry_run:
        ops: dict[str, Op] = {UPSTREAM: reference_op, FORK: reference_op}
        ident = check_identity(ops, "cpu")
        global DEVICE, graphs_us, MAX_POSITION
        DEVICE, MAX_POSITION = "cpu", 4096

        def run_once(fns: dict[str, Callable[[], None]]) -> dict[str, float]:
            """Each timed function runs once; its "time" is a fixed stand-in."""
            out = {}
            for i, (n, fn) in enumerate(fns.items()):
                fn()
                out[n] = 1.0 + 0.01 * i
            return out

        graphs_us = run_once
        fis = {FI_PEER: lambda p, q, k, h, c, n: reference_op(p, q, k, h, c, n)}
        fis[FI_SECOND] = fis[FI_PEER]
        for v in EXTRA:
            ops[v] = reference_op
        perf = [time_case(ops, fis, 8, 64, BF16, BF16, True, 64, 3e12)]
        perf.append(time_case(ops, fis, 8, 128, BF16, F32, True, 64, 3e12))
        layouts = [time_layout(ops, fis, n, 9, 3e12) for n in LAYOUTS]
        layouts += [dict(layouts[0], tokens=12288)]
        res = {
            "device": "cpu",
            "torch": torch.__version__,
            "cuda": None,
            "bandwidth": 3e12,
            "identity": ident,
            "empty": {n: "not run (dry run)" for n in ops},
            "perf": perf,
            "layouts": layouts,
        }
        print(markdown(res))
        small = [{"layout": small_name(perf[0]), "tokens": 8, "runs": [perf[0], perf[0]]}]
        small += [{"layout": r["layout"], "tokens": r["tokens"], "runs": [r]} for r in layouts]
        print(small_markdown(small))
        text = targets_markdown(res, small)
        (args.out / "targets.md").write_text(text)
        print(text)
        return 0 if not ident["failures"] else 1
    if not torch.cuda.is_available():
        print("error: no CUDA device (use --dry-run on a CPU)", file=sys.stderr)
        return 2

    import fi_ext

    t0 = time.time()
    os.environ["ROPE_FI_INCLUDE"] = str(args.flashinfer_include)
    fi_includes = {FI_PEER: args.flashinfer_include}
    if args.flashinfer_include_2:
        fi_includes[FI_SECOND] = args.flashinfer_include_2
    with ProcessPoolExecutor(
        3 + len(fi_includes) + len(EXTRA), mp_context=multiprocessing.get_context("spawn")
    ) as pool:
        futs = [
            pool.submit(rope_ext._build_only, v, str(args.src), str(args.build))
            for v in (UPSTREAM, FORK, *EXTRA)
        ]
        futs += [
            pool.submit(fi_ext.load, args.build, inc, FI_NAMESPACES[n])
            for n, inc in fi_includes.items()
        ]
        futs.append(pool.submit(load_probe, args.build))
        for f in futs:
            f.result()
    print(f"built in {time.time() - t0:.0f} s", flush=True)
    ops = {v: rope_ext.load(v, args.src, args.build) for v in (UPSTREAM, FORK, *EXTRA)}
    fis = {}
    for n, inc in fi_includes.items():
        fi_ext.load(args.build, inc, FI_NAMESPACES[n])
        fis[n] = getattr(torch.ops, FI_NAMESPACES[n]).apply
    load_probe(args.build)

    res: dict = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "flashinfer": {n: str(inc) for n, inc in fi_includes.items()},
    }
    props = torch.cuda.get_device_properties(0)
    res["device_props"] = {
        "multiprocessors": props.multi_processor_count,
        "l2_bytes": getattr(props, "L2_cache_size", None),
        "total_memory": props.total_memory,
    }
    bw_fn = copy_bandwidth
    if ROWS == "small":
        rounds = int(os.environ.get("ROPE_BENCH_ROUNDS", "9"))
        res["bandwidth"] = bw_fn()
        time_case(ops, fis, TOKENS[0], HEADS[0], BF16, BF16, True, HEADS[0], res["bandwidth"])
        res["small"] = []
        for head in HEADS:
            for tokens in (t for t in TOKENS if t <= SMALL_TOKENS):
                runs = [
                    time_case(ops, fis, tokens, head, BF16, BF16, True, head, res["bandwidth"])
                    for _ in range(rounds)
                ]
                res["small"].append({"layout": small_name(runs[0]), "tokens": tokens, "runs": runs})
                print(small_markdown(res["small"][-1:], header=False), flush=True)
        for name in LAYOUTS:
            for tokens in (t for t in LAYOUT_TOKENS if t <= SMALL_TOKENS):
                runs = [
                    time_layout(ops, fis, name, tokens, res["bandwidth"]) for _ in range(rounds)
                ]
                res["small"].append({"layout": name, "tokens": tokens, "runs": runs})
                print(small_markdown(res["small"][-1:], header=False), flush=True)
        text = small_markdown(res["small"])
        (args.out / "small.md").write_text(text + "\n")
        (args.out / "small.json").write_text(json.dumps(res, indent=1))
        print(text)
        full_json = args.out / "results.json"
        if full_json.is_file():
            full = json.loads(full_json.read_text())
            summary = targets_markdown(full, res["small"])
            (args.out / "targets.md").write_text(summary)
            print(summary)
        return 0
    res["identity"] = check_identity(ops, "cuda")
    print(
        f"identity: {res['identity']['cases']} cases, {len(res['identity']['failures'])} differ",
        flush=True,
    )
    res["identity_extra"] = {v: check_identity(ops, "cuda", v) for v in EXTRA}
    print({v: len(i["failures"]) for v, i in res["identity_extra"].items()}, flush=True)
    res["empty"] = check_empty([UPSTREAM, FORK, *fis], args.src, args.build, fi_includes)
    print(res["empty"], flush=True)
    res["bandwidth"] = bw_fn()
    # One discarded pass over the first (launch-bound) case: its times
    # otherwise depend on how far the clocks have ramped up.
    time_case(ops, fis, TOKENS[0], HEADS[0], BF16, BF16, True, HEADS[0], res["bandwidth"])
    perf = []
    for head in () if ONLY_GPTJ else HEADS:
        for tokens in TOKENS:
            perf.append(time_case(ops, fis, tokens, head, BF16, BF16, True, head, res["bandwidth"]))
            print(perf[-1], flush=True)
    for qd, cd, neox, frac in VARIANTS.values():
        if ONLY_GPTJ and neox:
            continue
        perf.append(
            time_case(ops, fis, 16384, 128, qd, cd, neox, int(128 * frac), res["bandwidth"])
        )
        print(perf[-1], flush=True)
    res["perf"] = perf
    res["layouts"] = []
    for name in LAYOUTS:
        if ONLY_GPTJ and LAYOUTS[name][4]:
            continue
        for tokens in LAYOUT_TOKENS:
            res["layouts"].append(time_layout(ops, fis, name, tokens, res["bandwidth"]))
            print(res["layouts"][-1], flush=True)
    text = markdown(res)
    (args.out / "results.md").write_text(text)
    (args.out / "results.json").write_text(json.dumps(res, indent=1))
    print(text)
    bad = res["identity"]["failures"] or any(i["failures"] for i in res["identity_extra"].values())
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main())
