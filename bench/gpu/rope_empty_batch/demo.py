"""The fork's empty-batch guard in ops.rotary_embedding, on upstream's kernel.

Upstream's rotary_embedding kernel divides by the number of tokens on the
host and kills the process with SIGFPE on an empty batch. The fork returns
from the Python op wrapper before calling the op (issue 11, item 4), so a
build with upstream's kernel (the precompiled wheel) survives it. This
shows, on the GPU:

1. an empty batch through upstream's kernel called directly, and through
   the fork's wrapper in front of the same kernel, each in its own
   subprocess (the first is expected to die);
2. every non-empty case of bench/gpu/rope_fast's matrix (all nine
   query/cache dtype pairs, NeoX and GPT-J, partial rotary, offsets,
   inverse, strided views, key=None, [B, S] positions, 1 to 65536 tokens)
   through the wrapper and through the kernel directly: bit-identical.

The wrapper is the fork tree's own code: ``rotary_embedding`` and the
module-level names it uses are compiled from the staged
``vllm/_custom_ops.py`` unchanged, and ``torch.ops._C.rotary_embedding``
is upstream's kernel built as an extension (rope_pytest_plugin of
bench/gpu/rope_cache_dtype registers it). ``--dry-run`` runs the same on
the CPU with a stand-in for the kernel that raises SIGFPE on an empty
batch as upstream's does.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
BENCH = HERE.parent  # bench/gpu, or the staged bench/
sys.path[:0] = [str(BENCH / "rope_cache_dtype")]

UPSTREAM = "upstream-0.21.0"
SCHEMA = (
    "rotary_embedding(Tensor positions, Tensor! query, Tensor!? key, "
    "int head_size, Tensor cos_sin_cache, bool is_neox, "
    "int rope_dim_offset=0, bool inverse=False) -> ()"
)
# (name, positions shape, with key, rope_dim_offset, inverse)
EMPTY_CASES = [
    ("[0] positions, key", (0,), True, 0, False),
    ("[0] positions, no key", (0,), False, 0, False),
    ("[0, 5] positions", (0, 5), True, 0, False),
    ("[3, 0] positions", (3, 0), True, 0, False),
    ("[0] positions, offset 64, inverse", (0,), True, 64, True),
]
HEAD, Q_HEADS, KV_HEADS = 128, 32, 8


def _rope_fast_bench():
    """bench/gpu/rope_fast/bench.py (its case matrix and CPU reference op)."""
    spec = importlib.util.spec_from_file_location(
        "rope_fast_bench", BENCH / "rope_fast" / "bench.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_wrapper(custom_ops: Path) -> tuple[Callable[..., None], list[str]]:
    """``rotary_embedding`` of the fork's vllm/_custom_ops.py with the
    module-level definitions it reaches, compiled from the file as it is."""
    tree = ast.parse(custom_ops.read_text(), filename=str(custom_ops))
    defined: dict[str, ast.stmt] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            defined[node.name] = node
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name):
                    defined[target.id] = node
        elif isinstance(node, ast.Import | ast.ImportFrom):
            # torch's own helpers (e.g. statically_known_true); nothing of vLLM
            # is installed on the GPU machine.
            module = node.module if isinstance(node, ast.ImportFrom) else None
            for alias in node.names:
                name = (alias.asname or alias.name).split(".")[0]
                if (module or alias.name).split(".")[0] == "torch":
                    defined[name] = node
    if "rotary_embedding" not in defined:
        raise SystemExit(f"error: {custom_ops} defines no rotary_embedding")
    keep: set[str] = set()
    todo = ["rotary_embedding"]
    while todo:
        name = todo.pop()
        if name in keep or name not in defined:
            continue
        keep.add(name)
        todo += [n.id for n in ast.walk(defined[name]) if isinstance(n, ast.Name)]
    nodes = {id(defined[n]) for n in keep}
    body = [node for node in tree.body if id(node) in nodes]
    namespace: dict = {"torch": torch, "__name__": "fork_custom_ops"}
    exec(compile(ast.Module(body=body, type_ignores=[]), str(custom_ops), "exec"), namespace)
    return namespace["rotary_embedding"], sorted(keep)


def register_kernel(args: argparse.Namespace) -> None:
    """Make ``torch.ops._C.rotary_embedding`` upstream's kernel (or, in a dry
    run, a CPU stand-in that dies like it on an empty batch)."""
    if not args.dry_run:
        os.environ.update(
            ROPE_BENCH_VARIANT=UPSTREAM,
            ROPE_BENCH_SRC=str(args.src),
            ROPE_BENCH_BUILD=str(args.build),
        )
        import rope_pytest_plugin  # noqa: F401  (registers _C::rotary_embedding)

        return
    reference = _rope_fast_bench().reference_op

    def stand_in(positions, query, key, head_size, cache, is_neox, offset=0, inverse=False):
        if positions.numel() == 0:  # upstream: query.numel() / num_tokens
            os.kill(os.getpid(), signal.SIGFPE)
        reference(positions, query, key, head_size, cache, is_neox, offset, inverse)

    global _LIB
    _LIB = torch.library.Library("_C", "DEF")
    _LIB.define(SCHEMA)
    _LIB.impl("rotary_embedding", stand_in, "CPU")


_LIB = None


def device(args: argparse.Namespace) -> str:
    return "cpu" if args.dry_run else "cuda"


def child(args: argparse.Namespace) -> int:
    """One empty-batch call in this process; exit 0 if it returns."""
    register_kernel(args)
    _, shape, with_key, offset, inverse = EMPTY_CASES[args.case]
    dev = device(args)
    positions = torch.zeros(shape, dtype=torch.long, device=dev)
    query = torch.empty(*shape, Q_HEADS * HEAD, dtype=torch.bfloat16, device=dev)
    key = torch.empty(*shape, KV_HEADS * HEAD, dtype=torch.bfloat16, device=dev)
    key = key if with_key else None
    cache = torch.rand(16, 64 if offset else HEAD, device=dev).to(torch.bfloat16)
    if args.through == "wrapper":
        wrapper, _ = load_wrapper(args.fork_ops)
        wrapper(positions, query, key, HEAD, cache, True, offset, inverse)
    else:
        torch.ops._C.rotary_embedding(positions, query, key, HEAD, cache, True, offset, inverse)
    if dev == "cuda":
        torch.cuda.synchronize()
    print("returned", flush=True)
    return 0


def run_empty(args: argparse.Namespace) -> list[dict]:
    rows = []
    common = ["--src", str(args.src), "--build", str(args.build), "--fork-ops", str(args.fork_ops)]
    if args.dry_run:
        common.append("--dry-run")
    for i, (name, *_) in enumerate(EMPTY_CASES):
        for through in ("kernel", "wrapper"):
            if through == "kernel" and i > 0:
                continue  # one death of upstream's kernel is enough
            cmd = [sys.executable, __file__, "--child", str(i), "--through", through, *common]
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
            if r.returncode == 0 and "returned" in r.stdout:
                result = "returned, no error"
            elif r.returncode < 0:
                result = f"killed by signal {-r.returncode} ({signal.Signals(-r.returncode).name})"
            else:
                last = [line for line in r.stderr.splitlines() if line.strip()]
                result = f"exit {r.returncode}: " + (last[-1][:160] if last else "")
            via = "fork wrapper -> upstream kernel" if through == "wrapper" else "upstream kernel"
            rows.append({"case": name, "through": via, "result": result})
            print(f"empty batch, {name}, {via}: {result}", flush=True)
    return rows


def run_identity(args: argparse.Namespace, wrapper: Callable[..., None]) -> dict:
    fast = _rope_fast_bench()
    dev = device(args)
    n, failures = 0, []
    for i, case in enumerate(fast.identity_cases()):
        if dev == "cpu" and case["tokens"] > 300:
            continue
        outs = []
        for call in ("kernel", "wrapper"):
            positions, q, k, extra = fast.make_inputs(case, dev, seed=i)
            if case["layout"] in ("fused-qkv", "misaligned"):
                g = torch.Generator(device=dev).manual_seed(i)
                cache = torch.rand(4096, case["rot"], device=dev, generator=g) * 2 - 1
                cache = cache.to(case["c"])
            else:
                cache = extra
            op_args = (positions, q, k, case["head"], cache, case["neox"], case["off"])
            if call == "kernel":
                torch.ops._C.rotary_embedding(*op_args, case["inverse"])
            else:
                wrapper(*op_args, case["inverse"])
            outs.append((q.clone(), None if k is None else k.clone()))
        n += 1
        (kq, kk), (wq, wk) = outs
        if not (torch.equal(kq, wq) and (kk is None or torch.equal(kk, wk))):
            failures.append({key: str(v) for key, v in case.items()})
    return {"cases": n, "failures": failures}


def markdown(res: dict) -> str:
    lines = [
        f"# Empty batch through the fork's ops.rotary_embedding on {res['device']}",
        "",
        f"torch {res['torch']}, CUDA {res['cuda']}; kernel: {res['kernel']}; wrapper: "
        f"{res['wrapper_source']} ({', '.join(res['wrapper_names'])}).",
        "",
        "| empty batch | through | result |",
        "|---|---|---|",
    ]
    lines += [f"| {r['case']} | {r['through']} | {r['result']} |" for r in res["empty"]]
    ident = res["identity"]
    lines += [
        "",
        f"Non-empty cases, fork wrapper vs the kernel called directly: "
        f"{ident['cases'] - len(ident['failures'])}/{ident['cases']} bit-identical.",
    ]
    lines += [f"- DIFFERS: {f}" for f in ident["failures"][:20]]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", type=Path, required=True, help="staged kernel sources (src/)")
    ap.add_argument("--build", type=Path, required=True, help="extension build folder")
    ap.add_argument("--fork-ops", type=Path, required=True, help="the fork's vllm/_custom_ops.py")
    ap.add_argument("--out", type=Path, help="results folder (results.md, results.json)")
    ap.add_argument("--dry-run", action="store_true", help="on the CPU, with a stand-in kernel")
    ap.add_argument("--child", type=int, dest="case", help=argparse.SUPPRESS)
    ap.add_argument("--through", choices=("kernel", "wrapper"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if not args.fork_ops.is_file():
        print(f"error: {args.fork_ops} missing (run prepare.sh first)", file=sys.stderr)
        return 2
    if args.case is not None:
        return child(args)
    if args.out is None:
        ap.error("--out is required")
    if not args.dry_run and not torch.cuda.is_available():
        print("error: no CUDA device (use --dry-run on a CPU)", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    register_kernel(args)  # builds the extension once; the children reuse it
    wrapper, names = load_wrapper(args.fork_ops)
    res = {
        "device": "cpu (dry run, stand-in kernel)"
        if args.dry_run
        else torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "kernel": "a CPU stand-in that raises SIGFPE on an empty batch"
        if args.dry_run
        else f"{UPSTREAM} csrc/pos_encoding_kernels.cu built as an extension",
        "wrapper_source": str(args.fork_ops),
        "wrapper_names": names,
        "empty": run_empty(args),
    }
    res["identity"] = run_identity(args, wrapper)
    text = markdown(res)
    (args.out / "results.md").write_text(text)
    (args.out / "results.json").write_text(json.dumps(res, indent=1))
    print(text)
    wrapper_ok = all(
        r["result"] == "returned, no error" for r in res["empty"] if "wrapper" in r["through"]
    )
    return 0 if wrapper_ok and not res["identity"]["failures"] else 1


if __name__ == "__main__":
    sys.exit(main())
