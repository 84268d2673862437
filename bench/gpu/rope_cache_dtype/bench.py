"""Check and time builds of vLLM's CUDA rotary_embedding op (rope-cache-dtype).

Compares the fork's 0.20.0 kernel (cache read in its own dtype, dispatch
bounded to cache == query dtype or float32) with pristine 0.20.0 (whole cache
converted to float32 on every call) and pristine 0.21.0 (upstream's version
of the change, all nine dtype pairs):

1. correctness of every allowed (query, cache) dtype pair, NeoX and GPT-J,
   with rope_dim_offset and inverse, against a float64 reference on fresh
   random inputs with positions over the whole cache;
2. what each build does with a rejected pair (fp16 query, bf16 cache);
3. extra device memory per call and time per call (eager loop and CUDA graph
   replay, median of repeats, with the run-to-run spread) against the
   memory-bandwidth floor.

Prints Markdown tables and writes results.md / results.json to --out.
``--dry-run`` runs the same logic on the CPU against a PyTorch stand-in for
the op (no builds, no memory or graph numbers), to check the script itself.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import rope_ext
import torch

HEAD_SIZE = 128
NUM_Q_HEADS = 32
NUM_KV_HEADS = 8
MAX_POSITION = 131072
ROT_DIM = 128
TOKENS = (1, 256, 4096, 16384)
BANDWIDTH = 3.0e12  # B/s, H100 SXM device-to-device copy (read + write)


F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32
ALLOWED = ((F16, F16), (F16, F32), (BF16, BF16), (BF16, F32), (F32, F32))
REJECTED = (F16, BF16)
TOLERANCE = {F16: 2e-3, BF16: 1.6e-2, F32: 1e-5}
# (rot_dim, rope_dim_offset) cases for the correctness check.
ROTARY_CASES = ((128, 0), (64, 0), (64, 64))

Op = Callable[..., None]


def short(dtype: torch.dtype) -> str:
    return {F16: "fp16", BF16: "bf16", F32: "fp32"}[dtype]


def reference(
    positions: torch.Tensor,
    x: torch.Tensor,
    cache: torch.Tensor,
    rope_dim_offset: int,
    is_neox: bool,
    inverse: bool,
) -> torch.Tensor:
    """Rotary embedding in float64 of x: [tokens, heads * HEAD_SIZE]."""
    rot_dim = cache.size(1)
    half = rot_dim // 2
    out = x.double().view(x.size(0), -1, HEAD_SIZE).clone()
    cos_sin = cache.double()[positions]
    cos, sin = cos_sin[:, None, :half], cos_sin[:, None, half:]
    if inverse:
        sin = -sin
    rot = out[..., rope_dim_offset : rope_dim_offset + rot_dim]
    if is_neox:
        a, b = rot[..., :half].clone(), rot[..., half:].clone()
        rot[..., :half] = a * cos - b * sin
        rot[..., half:] = b * cos + a * sin
    else:
        a, b = rot[..., 0::2].clone(), rot[..., 1::2].clone()
        rot[..., 0::2] = a * cos - b * sin
        rot[..., 1::2] = b * cos + a * sin
    return out.view(x.shape)


def reference_op(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor | None,
    head_size: int,
    cache: torch.Tensor,
    is_neox: bool,
    rope_dim_offset: int = 0,
    inverse: bool = False,
) -> None:
    """Stand-in for the op in --dry-run, with the fork's dtype rule."""
    if cache.dtype not in (query.dtype, F32):
        raise RuntimeError(f"stand-in: cos_sin_cache dtype {cache.dtype} with query {query.dtype}")
    for x in (query, key):
        if x is not None:
            x.copy_(reference(positions, x, cache, rope_dim_offset, is_neox, inverse))


def random_positions(n: int, max_position: int, device: str) -> torch.Tensor:
    positions = torch.randint(0, max_position, (n,), device=device)
    positions[0] = 0
    positions[-1] = max_position - 1
    return positions


def check_correctness(op: Op, device: str, num_tokens: int) -> list[dict]:
    rows = []
    for query_dtype, cache_dtype in ALLOWED:
        max_err, cases, ok = 0.0, 0, True
        for is_neox in (True, False):
            for rot_dim, offset in ROTARY_CASES:
                for inverse in (False, True):
                    # Random values, not real cos/sin: a misread shows.
                    cache = torch.rand(MAX_POSITION, rot_dim, device=device)
                    cache = (cache * 2 - 1).to(cache_dtype)
                    positions = random_positions(num_tokens, MAX_POSITION, device)
                    q = torch.randn(
                        num_tokens,
                        NUM_Q_HEADS * HEAD_SIZE,
                        dtype=query_dtype,
                        device=device,
                    )
                    k = torch.randn(
                        num_tokens,
                        NUM_KV_HEADS * HEAD_SIZE,
                        dtype=query_dtype,
                        device=device,
                    )
                    ref_q = reference(positions, q, cache, offset, is_neox, inverse)
                    ref_k = reference(positions, k, cache, offset, is_neox, inverse)
                    op(positions, q, k, HEAD_SIZE, cache, is_neox, offset, inverse)
                    tol = TOLERANCE[query_dtype]
                    for out, ref in ((q, ref_q), (k, ref_k)):
                        diff = (out.double() - ref).abs()
                        max_err = max(max_err, float(diff.max()))
                        ok &= bool(torch.allclose(out.double(), ref, atol=tol, rtol=tol))
                    cases += 1
        rows.append(
            {
                "query": short(query_dtype),
                "cache": short(cache_dtype),
                "cases": cases,
                "max_abs_err": max_err,
                "tol": TOLERANCE[query_dtype],
                "ok": ok,
            }
        )
    return rows


def check_rejection(op: Op, device: str) -> str:
    query_dtype, cache_dtype = REJECTED
    cache = torch.rand(64, ROT_DIM, device=device).to(cache_dtype)
    q = torch.randn(4, NUM_Q_HEADS * HEAD_SIZE, dtype=query_dtype, device=device)
    positions = random_positions(4, 64, device)
    try:
        op(positions, q, None, HEAD_SIZE, cache, True, 0, False)
        if device == "cuda":
            torch.cuda.synchronize()
    except RuntimeError as e:
        return "rejected: " + str(e).splitlines()[0]
    return "accepted (no error)"


def make_sets(
    num_tokens: int, cache: torch.Tensor, n_sets: int, device: str
) -> tuple[list[tuple], float]:
    """Input sets to rotate through, and the bytes one call must move."""
    sets, moved = [], 0.0
    for _ in range(n_sets):
        positions = torch.randint(0, MAX_POSITION, (num_tokens,), device=device)
        q = torch.randn(num_tokens, NUM_Q_HEADS * HEAD_SIZE, dtype=BF16, device=device)
        k = torch.randn(num_tokens, NUM_KV_HEADS * HEAD_SIZE, dtype=BF16, device=device)
        sets.append((positions, q, k, HEAD_SIZE, cache, True, 0, False))
        rows = int(torch.unique(positions).numel())
        # Read q and k once, write them once, read the cache rows used.
        moved += 2 * (q.nbytes + k.nbytes) + rows * ROT_DIM * cache.element_size()
    return sets, moved / n_sets


def extra_bytes(op: Op, args: tuple, device: str) -> float:
    if device != "cuda":
        return float("nan")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    op(*args)
    torch.cuda.synchronize()
    return float(torch.cuda.max_memory_allocated() - before)


def time_eager(op: Op, sets: list[tuple], iters: int, repeats: int, device: str) -> list[float]:
    """Microseconds per call of a loop of iters calls, once per repeat."""
    for i in range(10):
        op(*sets[i % len(sets)])
    per_call = []
    if device != "cuda":
        for _ in range(repeats):
            t0 = time.perf_counter()
            for i in range(iters):
                op(*sets[i % len(sets)])
            per_call.append((time.perf_counter() - t0) * 1e6 / iters)
        return per_call
    torch.cuda.synchronize()
    for _ in range(repeats):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for i in range(iters):
            op(*sets[i % len(sets)])
        end.record()
        end.synchronize()
        per_call.append(start.elapsed_time(end) * 1e3 / iters)
    return per_call


def time_graph(op: Op, sets: list[tuple], iters: int, repeats: int, device: str) -> list[float]:
    """Microseconds per call when iters calls replay as one CUDA graph."""
    if device != "cuda":
        return [float("nan")] * repeats
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(3):
            op(*sets[i % len(sets)])
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(iters):
            op(*sets[i % len(sets)])
    graph.replay()
    torch.cuda.synchronize()
    per_call = []
    for _ in range(repeats):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        per_call.append(start.elapsed_time(end) * 1e3 / iters)
    del graph
    return per_call


def summary(samples: list[float]) -> tuple[float, float]:
    """Median and spread ((max - min) / median, in %) of the repeats."""
    median = statistics.median(samples)
    if median != median or median == 0:  # nan
        return median, float("nan")
    return median, 100.0 * (max(samples) - min(samples)) / median


def measure(
    ops: dict[str, Op],
    device: str,
    tokens: tuple[int, ...],
    iters: int,
    repeats: int,
    bandwidth: float,
) -> list[dict]:
    rows = []
    for cache_dtype in (F32, BF16):
        cache = (torch.rand(MAX_POSITION, ROT_DIM, device=device) * 2 - 1).to(cache_dtype)
        for num_tokens in tokens:
            sets, moved = make_sets(num_tokens, cache, 4, device)
            for name, op in ops.items():
                extra = extra_bytes(op, sets[0], device)
                eager, eager_spread = summary(time_eager(op, sets, iters, repeats, device))
                graph, graph_spread = summary(time_graph(op, sets, iters, repeats, device))
                rows.append(
                    {
                        "cache": short(cache_dtype),
                        "tokens": num_tokens,
                        "variant": name,
                        "extra_mib": extra / 2**20,
                        "eager_us": eager,
                        "eager_spread_pct": eager_spread,
                        "graph_us": graph,
                        "graph_spread_pct": graph_spread,
                        "bytes": moved,
                        "floor_us": moved / bandwidth * 1e6,
                    }
                )
            del sets
        del cache
    return rows


def markdown(results: dict) -> str:
    lines = [f"# rope-cache-dtype on {results['device']}", ""]
    lines += [
        f"torch {results['torch']}, CUDA {results['cuda']}; query bf16 for the "
        f"timings; cache {MAX_POSITION} x {ROT_DIM}; {NUM_Q_HEADS} q heads, "
        f"{NUM_KV_HEADS} kv heads, head {HEAD_SIZE}; NeoX; 4 rotating input "
        f"sets; floor = bytes / {results['bandwidth']:.2e} B/s.",
        "",
        "## Correctness against float64 (max abs error over "
        "NeoX/GPT-J x rot_dim/rope_dim_offset x inverse)",
        "",
        "| variant | query | cache | cases | max abs err | tol | ok |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, rows in results["correctness"].items():
        for r in rows:
            lines.append(
                f"| {name} | {r['query']} | {r['cache']} | {r['cases']} | "
                f"{r['max_abs_err']:.3g} | {r['tol']:g} | "
                f"{'yes' if r['ok'] else 'NO'} |"
            )
    lines += ["", "## Rejected pair (fp16 query, bf16 cache)", ""]
    lines += ["| variant | result |", "|---|---|"]
    for name, text in results["rejection"].items():
        lines.append(f"| {name} | {text.replace('|', '/')} |")
    lines += [
        "",
        "## Memory and time per call (bf16 query)",
        "",
        "| cache | tokens | variant | extra MiB | eager us | spread % | "
        "graph us | spread % | floor us |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results["perf"]:
        lines.append(
            f"| {r['cache']} | {r['tokens']} | {r['variant']} | "
            f"{r['extra_mib']:.1f} | {r['eager_us']:.2f} | "
            f"{r['eager_spread_pct']:.1f} | {r['graph_us']:.2f} | "
            f"{r['graph_spread_pct']:.1f} | {r['floor_us']:.3f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", type=Path, required=True, help="variant sources")
    parser.add_argument("--build", type=Path, required=True, help="build folder")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--iters", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--bandwidth", type=float, default=BANDWIDTH, help="B/s for the floor")
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args()

    args.out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    if args.dry_run:
        device = "cpu"
        ops: dict[str, Op] = {"stand-in": reference_op}
        tokens, correctness_tokens = (1, 16), 8
    else:
        if not torch.cuda.is_available():
            print("error: no CUDA device (use --dry-run on a CPU)", file=sys.stderr)
            return 2
        device = "cuda"
        t0 = time.time()
        rope_ext.build_all(rope_ext.VARIANTS, args.src, args.build)
        print(f"built {len(rope_ext.VARIANTS)} variants in {time.time() - t0:.0f} s")
        ops = {v: rope_ext.load(v, args.src, args.build) for v in rope_ext.VARIANTS}
        tokens, correctness_tokens = TOKENS, 512

    results: dict = {
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "correctness": {},
        "rejection": {},
    }
    for name, op in ops.items():
        results["correctness"][name] = check_correctness(op, device, correctness_tokens)
        results["rejection"][name] = check_rejection(op, device)
    results["bandwidth"] = args.bandwidth
    results["perf"] = measure(ops, device, tokens, args.iters, args.repeats, args.bandwidth)

    text = markdown(results)
    (args.out / "results.md").write_text(text)
    (args.out / "results.json").write_text(json.dumps(results, indent=1))
    print(text)
    ok = all(r["ok"] for rows in results["correctness"].values() for r in rows)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
