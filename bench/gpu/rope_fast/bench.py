"""Time the fork's RoPE kernel against upstream's and FlashInfer's (issue 18).

In one process on one GPU:

1. bit-identity of the fork's build against upstream's build of
   csrc/pos_encoding_kernels.cu over a matrix of cases (NeoX/GPT-J, partial
   rotary, rope_dim_offset, inverse, odd head sizes, strided fused-qkv views,
   key=None, [B, S] positions, every query/cache dtype pair);
2. an empty batch through each op, each in its own subprocess (a crash there
   must not end the benchmark);
3. the device-to-device copy bandwidth, and per case the time of upstream's
   kernel, the fork's, FlashInfer's (float32 cache, as it requires), an
   in-place scale of the same q and k, and two touches (probe.cu) of only
   the rotated bytes of q and k, each as the median of 7 replays of a CUDA
   graph of 20 calls (the replays of the ops interleaved), against the
   floor = bytes that must move / that bandwidth.

Writes results.md and results.json to --out. ``--dry-run`` checks the
script on the CPU with PyTorch stand-ins for the ops (no builds, no times).
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

# Model-shaped layout classes (issue 30), each at these token counts:
# name: (q heads, kv heads, head_size, rot_dim, is_neox, cache dtype, layout).
#   mla: DeepSeek-V3 MLA rope: q_pe is the last 64 of every 192-wide query
#        head ([T, H, 192][..., 128:]), k_pe the last 64 of the 576-wide
#        compressed kv row ([T, 576][:, 512:], one head); GPT-J style, the
#        cache in the model dtype. 16 heads = TP8, 128 heads = TP1.
#   fused: GLM-4-style GPT-J partial rotary: rot 64 of 128, q and k as views
#        of the fused qkv projection (32 q heads, 2 kv heads).
LAYOUT_TOKENS = (1, 8, 64, 1024, 4096, 12288, 32768)
LAYOUTS = {
    "MLA TP8": (16, 1, 64, 64, False, BF16, "mla"),
    "MLA TP1": (128, 1, 64, 64, False, BF16, "mla"),
    "GPT-J partial": (32, 2, 128, 64, False, BF16, "fused"),
}

Op = Callable[..., None]


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
if name == "flashinfer":
    import fi_ext
    fi_ext.load(Path({build!r}))
    op = lambda p, q, k, h, c, n: torch.ops.rope_flashinfer.apply(p, q, k, h, c, n)
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


def check_empty(names: list[str], src: Path, build: Path) -> dict[str, str]:
    out = {}
    for name in names:
        code = EMPTY_SNIPPET.format(
            paths=[str(HERE), str(HERE.parent / "rope_cache_dtype")],
            name=name,
            src=str(src),
            build=str(build),
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


def time_case(ops, fi, tokens, head, qd, cd, neox, rot, bandwidth) -> dict:
    positions = torch.randint(0, MAX_POSITION, (tokens,), device="cuda")
    q = torch.randn(tokens, NUM_Q_HEADS * head, device="cuda", dtype=qd)
    k = torch.randn(tokens, NUM_KV_HEADS * head, device="cuda", dtype=qd)
    cache = rope_cache(rot, cd, "cuda")
    cache32 = cache if cd == F32 else rope_cache(rot, F32, "cuda")
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
    fns["flashinfer"] = lambda: fi(positions, q, k, head, cache32, neox)
    fns["scale"] = lambda: (q.mul_(1.0), k.mul_(1.0))
    # What the memory system gives for the access pattern itself: read and
    # write back only the rotated bytes of each head (no cache rows, no
    # arithmetic), in 16-byte pieces.
    touch = torch.ops.rope_probe.touch
    head_bytes, rot_bytes = head * elem, rot * elem
    for name, items in TOUCHES.items():
        fns[name] = lambda items=items: (
            touch(q, head_bytes, rot_bytes, TOUCH_THREADS, items),
            touch(k, head_bytes, rot_bytes, TOUCH_THREADS, items),
        )
    row.update(graphs_us(fns))
    row["flashinfer_cache"] = "fp32"
    return row


def time_layout(ops, fi, name: str, tokens: int, bandwidth: float) -> dict:
    """One row of a model-shaped layout class (LAYOUTS): q and k are the
    views the model passes; the touch reads and writes back only their
    rotated bytes, in the same rows, in 16-byte pieces."""
    hq, hk, head, rot, neox, cd, layout = LAYOUTS[name]
    positions = torch.randint(0, MAX_POSITION, (tokens,), device="cuda")
    cache = rope_cache(rot, cd, "cuda")
    cache32 = cache if cd == F32 else rope_cache(rot, F32, "cuda")
    if layout == "mla":
        q_full = torch.randn(tokens, hq, 192, device="cuda", dtype=BF16)
        kv = torch.randn(tokens, 576, device="cuda", dtype=BF16)
        q, k = q_full[..., 128:], kv[:, 512:].unsqueeze(1)
        # The rotated 128 bytes of every 384-byte q row and 1152-byte kv
        # row: the same pieces as bytes 256.. and 1024.. of those rows.
        touched = [(q_full, 384), (kv, 1152)]
    else:
        qkv = torch.randn(tokens, (hq + 2 * hk) * head, device="cuda", dtype=BF16)
        q, k = qkv[:, : hq * head], qkv[:, hq * head : (hq + hk) * head]
        touched = [(torch.randn(tokens, (hq + hk) * head, device="cuda", dtype=BF16), 256)]
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
    fns["flashinfer"] = lambda: fi(positions, q, k, head, cache32, neox)
    full = [t for t, _ in touched]
    fns["scale"] = lambda: [t.mul_(1.0) for t in full]
    probe = torch.ops.rope_probe.touch
    for tname, items in TOUCHES.items():
        fns[tname] = lambda items=items: [
            probe(t, row_bytes, rot * 2, TOUCH_THREADS, items) for t, row_bytes in touched
        ]
    row.update(graphs_us(fns))
    row["flashinfer_cache"] = "fp32"
    return row


def layout_markdown(res: dict) -> list[str]:
    """The layout classes: the four ratios per row, then issue 30's targets."""
    rows = res.get("layouts", [])
    if not rows:
        return []
    lines = [
        "",
        "## Model-shaped layout classes (issue 30)",
        "",
        "MLA = DeepSeek-V3 q_pe/k_pe views (64 rotated of every 192-wide q head, "
        "one 64-wide k_pe head in the 576-wide kv row), GPT-J style, bf16 cache; "
        "GPT-J partial = GLM-4-style q/k views of a fused qkv, rot 64 of 128. "
        "touch = reading and writing back only the rotated bytes of the same rows.",
        "",
        "| layout | q/kv heads | tokens | upstream us | fork us | FlashInfer us | touch us "
        "| floor us | fork/FlashInfer | fork/upstream | fork/floor | fork/touch |"
        + "".join(f" {v} us | {v}/FI | {v}/touch |" for v in EXTRA),
        "|---|---|---|---|---|---|---|---|---|---|---|---|" + "---|---|---|" * len(EXTRA),
    ]
    for r in rows:
        lines.append(
            f"| {r['layout']} | {r['heads']} | {r['tokens']} | {r[UPSTREAM]:.2f} | "
            f"{r[FORK]:.2f} | {r['flashinfer']:.2f} | {r['touch']:.2f} | "
            f"{r['floor_us']:.2f} | {r[FORK] / r['flashinfer']:.3f} | "
            f"{r[FORK] / r[UPSTREAM]:.3f} | {r[FORK] / r['floor_us']:.3f} | "
            f"{r[FORK] / r['touch']:.3f} |"
            + "".join(
                f" {r[v]:.2f} | {r[v] / r['flashinfer']:.3f} | {r[v] / r['touch']:.3f} |"
                for v in EXTRA
                if v in r
            )
        )
    lines += ["", "Targets (issue 30):", ""]
    for r in rows:
        checks = [
            (r[FORK] <= r["flashinfer"], f"fork {r[FORK]:.2f} <= FlashInfer {r['flashinfer']:.2f}"),
            (r[FORK] <= r[UPSTREAM], f"fork <= upstream {r[UPSTREAM]:.2f}"),
        ]
        if r["tokens"] >= 12288:
            ratio = r[FORK] / r["touch"]
            checks.append((ratio <= 1.05, f"fork/touch {ratio:.3f} <= 1.05"))
        ok = all(c for c, _ in checks)
        lines.append(
            f"- {'met' if ok else 'MISSED'}: {r['layout']} x {r['tokens']}: "
            + "; ".join(t for _, t in checks)
        )
    return lines


def small_markdown(rows: list[dict], header: bool = True) -> str:
    """The launch-bound rows timed round after round: per row the medians
    over the rounds and the spread of fork/FlashInfer."""
    lines = []
    if header:
        cols = [
            "layout", "tokens", "rounds", "fork us", "FlashInfer us", "fork/FI median",
            "fork/FI min", "fork/FI max", "rounds fork <= FI",
            *(f"{v}/FI median" for v in EXTRA),
        ]  # fmt: skip
        lines += ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for row in rows:
        runs = row["runs"]
        ratio = [r[FORK] / r["flashinfer"] for r in runs]
        extra = [statistics.median(r[v] / r["flashinfer"] for r in runs) for v in EXTRA]
        cells = [
            row["layout"],
            str(row["tokens"]),
            str(len(runs)),
            f"{statistics.median(r[FORK] for r in runs):.2f}",
            f"{statistics.median(r['flashinfer'] for r in runs):.2f}",
            f"{statistics.median(ratio):.3f}",
            f"{min(ratio):.3f}",
            f"{max(ratio):.3f}",
            str(sum(x <= 1 for x in ratio)),
            *(f"{x:.3f}" for x in extra),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


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
        "FlashInfer reads a float32 cache (its only option). touch = reading and "
        "writing back in place only the rotated bytes of q and k, in 16-byte pieces, "
        f"one per thread in address order ({TOUCH_THREADS}-thread blocks); NeoX touch "
        "= the same, each thread its x and y pieces as a NeoX kernel reads them; "
        "neither reads cache rows (probe.cu).",
        "",
        "| head | tokens | query | cache | style | rot | upstream us | fork us | "
        "FlashInfer us | scale us | touch us | NeoX touch us | floor us | fork/floor | "
        "touch/floor | fork/touch | fork/FI | fork/upstream |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in res["perf"]:
        lines.append(
            f"| {r['head']} | {r['tokens']} | {r['query']} | {r['cache']} | {r['style']} | "
            f"{r['rot_dim']} | {r[UPSTREAM]:.2f} | {r[FORK]:.2f} | {r['flashinfer']:.2f} | "
            f"{r['scale']:.2f} | {r['touch']:.2f} | {r['touch_neox']:.2f} | "
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
    ap.add_argument("--flashinfer-include", type=Path, required=True)
    ap.add_argument("--build", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)

    if args.dry_run:
        ops: dict[str, Op] = {UPSTREAM: reference_op, FORK: reference_op}
        ident = check_identity(ops, "cpu")
        res = {
            "device": "cpu",
            "torch": torch.__version__,
            "cuda": None,
            "bandwidth": 3e12,
            "identity": ident,
            "empty": {n: "not run (dry run)" for n in ops},
            "perf": [],
        }
        print(markdown(res))
        return 0 if not ident["failures"] else 1
    if not torch.cuda.is_available():
        print("error: no CUDA device (use --dry-run on a CPU)", file=sys.stderr)
        return 2

    import fi_ext

    t0 = time.time()
    os.environ["ROPE_FI_INCLUDE"] = str(args.flashinfer_include)
    with ProcessPoolExecutor(
        4 + len(EXTRA), mp_context=multiprocessing.get_context("spawn")
    ) as pool:
        futs = [
            pool.submit(rope_ext._build_only, v, str(args.src), str(args.build))
            for v in (UPSTREAM, FORK, *EXTRA)
        ]
        futs.append(pool.submit(fi_ext.load, args.build))
        futs.append(pool.submit(load_probe, args.build))
        for f in futs:
            f.result()
    print(f"built in {time.time() - t0:.0f} s", flush=True)
    ops = {v: rope_ext.load(v, args.src, args.build) for v in (UPSTREAM, FORK, *EXTRA)}
    fi_ext.load(args.build)
    fi = torch.ops.rope_flashinfer.apply
    load_probe(args.build)

    res: dict = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
    }
    res["identity"] = check_identity(ops, "cuda")
    print(
        f"identity: {res['identity']['cases']} cases, {len(res['identity']['failures'])} differ",
        flush=True,
    )
    res["identity_extra"] = {v: check_identity(ops, "cuda", v) for v in EXTRA}
    print({v: len(i["failures"]) for v, i in res["identity_extra"].items()}, flush=True)
    res["empty"] = check_empty([UPSTREAM, FORK, "flashinfer"], args.src, args.build)
    print(res["empty"], flush=True)
    res["bandwidth"] = copy_bandwidth()
    # One discarded pass over the first (launch-bound) case: its times
    # otherwise depend on how far the clocks have ramped up.
    time_case(ops, fi, TOKENS[0], HEADS[0], BF16, BF16, True, HEADS[0], res["bandwidth"])
    if ROWS == "small":
        rounds = int(os.environ.get("ROPE_BENCH_ROUNDS", "9"))
        res["small"] = []
        for name in LAYOUTS:
            for tokens in (t for t in LAYOUT_TOKENS if t <= SMALL_TOKENS):
                runs = [time_layout(ops, fi, name, tokens, res["bandwidth"]) for _ in range(rounds)]
                res["small"].append({"layout": name, "tokens": tokens, "runs": runs})
                print(small_markdown(res["small"][-1:], header=False), flush=True)
        text = small_markdown(res["small"])
        (args.out / "small.md").write_text(text)
        (args.out / "small.json").write_text(json.dumps(res, indent=1))
        print(text)
        return 0
    perf = []
    for head in () if ONLY_GPTJ else HEADS:
        for tokens in TOKENS:
            perf.append(time_case(ops, fi, tokens, head, BF16, BF16, True, head, res["bandwidth"]))
            print(perf[-1], flush=True)
    for qd, cd, neox, frac in VARIANTS.values():
        if ONLY_GPTJ and neox:
            continue
        perf.append(time_case(ops, fi, 16384, 128, qd, cd, neox, int(128 * frac), res["bandwidth"]))
        print(perf[-1], flush=True)
    res["perf"] = perf
    res["layouts"] = []
    for name in LAYOUTS:
        for tokens in LAYOUT_TOKENS:
            res["layouts"].append(time_layout(ops, fi, name, tokens, res["bandwidth"]))
            print(res["layouts"][-1], flush=True)
    text = markdown(res)
    (args.out / "results.md").write_text(text)
    (args.out / "results.json").write_text(json.dumps(res, indent=1))
    print(text)
    bad = res["identity"]["failures"] or any(i["failures"] for i in res["identity_extra"].values())
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main())
