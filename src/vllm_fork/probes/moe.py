"""Probes for the DeepSeek MoE bias precast and the DeepSeek-V3.2 decode changes."""

from __future__ import annotations

import ast
import re

from vllm_fork.facts.finding import ABSENT, NA, PRESENT, Finding
from vllm_fork.probes import pyast
from vllm_fork.sourcetree import SourceTree

DEEPSEEK = "vllm/model_executor/models/deepseek_v2.py"
AITER_OPS = "vllm/_aiter_ops.py"
ROUTER_CALLERS = (
    "vllm/model_executor/layers/fused_moe/router/fused_topk_bias_router.py",
    "vllm/model_executor/layers/fused_moe/rocm_aiter_fused_moe.py",
    "vllm/model_executor/layers/fused_moe/experts/rocm_aiter_moe.py",
)
SPARSE_MLA = "vllm/v1/attention/backends/mla/rocm_aiter_mla_sparse.py"
BIAS = "e_score_correction_bias"
MISSING = "missing"  # state of one part of a change
POST_LOAD = re.compile(r"load_weights|after_load|post_load|weights_loaded|process_weights")


def _is_cast(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and pyast.call_name(node) in ("to", "type", "float", "half")


def _aiter_guarded(node: ast.AST, parent_of: dict[ast.AST, ast.AST]) -> bool:
    return any(pyast.mentions(g, "aiter") for g in pyast.guards(node, parent_of))


# --------------------------------------------------------------------------- MoE bias precast


def _bias_precast(module: ast.Module) -> list[str]:
    """Functions (not forward) that replace the bias data by a cast copy under AITER."""
    found = []
    for fn in pyast.functions(module):
        if fn.name.startswith("forward"):
            continue
        parent_of = pyast.parents(fn)
        assigns = pyast.local_assignments(fn)
        for node in ast.walk(fn):
            if not isinstance(node, ast.Assign) or not _is_cast(node.value):
                continue
            for t in node.targets:
                if (
                    isinstance(t, ast.Attribute)
                    and t.attr == "data"
                    and BIAS in pyast.dataflow_ids(t.value, assigns, skip_scalars=False)
                    and _aiter_guarded(node, parent_of)
                ):
                    found.append(fn.name)
    return found


def _wrapper_state(module: ast.Module | None) -> str | None:
    """How biased_grouped_topk casts its bias: 'conditional' | 'always' | 'never';
    None when there is no such wrapper."""
    if module is None:
        return None
    wrappers = [
        fn
        for cls in pyast.classes_with_method(module, "biased_grouped_topk")
        if (fn := pyast.method(cls, "biased_grouped_topk")) is not None
    ]
    if not wrappers:
        return None
    fn = wrappers[0]
    params = [a.arg for a in fn.args.args]
    bias = next((p for p in params if "bias" in p), None)
    if bias is None:
        return "never"
    parent_of = pyast.parents(fn)
    state = "never"
    for node in ast.walk(fn):
        if _is_cast(node) and bias in pyast.identifiers(node):
            conds = pyast.guards(node, parent_of)
            if any(
                isinstance(c, ast.Compare)
                and any(pyast.is_dtype_attr(o) for o in [c.left, *c.comparators])
                for g in conds
                for c in ast.walk(g)
            ):
                state = "conditional"
            else:
                return "always"
    return state


def _casting_callers(tree: SourceTree) -> tuple[list[str], list[str]]:
    """(files calling biased_grouped_topk, those passing a cast bias)."""
    callers, casting = [], []
    for path in ROUTER_CALLERS:
        module = pyast.parse(tree.read_text(path))
        if module is None:
            continue
        if not pyast.calls(module, "biased_grouped_topk"):
            continue
        callers.append(path)
        if any(_passes_cast_bias(fn) for fn in pyast.functions(module)):
            casting.append(path.rsplit("/", 1)[-1])
    return callers, casting


def _passes_cast_bias(fn: pyast.FuncDef) -> bool:
    """``fn`` calls biased_grouped_topk with a cast bias (directly or via a local)."""
    assigns = pyast.local_assignments(fn)
    for c in pyast.calls(fn, "biased_grouped_topk"):
        args = list(c.args[1:2]) + [k.value for k in c.keywords if k.arg and "bias" in k.arg]
        for a in args:
            values = [a, *assigns.get(a.id, [])] if isinstance(a, ast.Name) else [a]
            if any(_is_cast(v) for v in values):
                return True
    return False


def probe_moe_bias_precast(tree: SourceTree) -> Finding:
    ops = pyast.parse(tree.read_text(AITER_OPS))
    wrapper = _wrapper_state(ops)
    if wrapper is None:
        return Finding(NA, f"no biased_grouped_topk wrapper in {AITER_OPS}", {})
    model = pyast.parse(tree.read_text(DEEPSEEK))
    if model is None:
        return Finding(NA, f"{DEEPSEEK} missing or unparsable", {})
    precast = _bias_precast(model)
    callers, casting = _casting_callers(tree)
    missing = []
    if not precast:
        missing.append("deepseek_v2.py does not cast the bias once under AITER MoE")
    if wrapper != "conditional":
        missing.append(f"biased_grouped_topk casts {wrapper} (not only on dtype mismatch)")
    if casting:
        missing.append("router callers still cast: " + ", ".join(casting))
    if missing:
        return Finding(ABSENT, "; ".join(missing), {})
    return Finding(
        PRESENT,
        f"bias cast once in {precast[0]}(); wrapper casts on dtype mismatch only; "
        f"{len(callers)} AITER router caller(s) pass the bias as is",
        {},
    )


# --------------------------------------------------------------------------- V3.2 decode


def _moe_class(module: ast.Module) -> ast.ClassDef | None:
    for node in ast.walk(module):
        if (
            isinstance(node, ast.ClassDef)
            and pyast.mentions(node, BIAS)
            and pyast.calls(node, "set_out_dtype") + _gate_ctor_out_dtype(node)
        ):
            return node
    return None


def _gate_ctor_out_dtype(cls: ast.ClassDef) -> list[ast.Call]:
    return [
        c
        for c in pyast.calls(cls)
        if "gate" in pyast.call_name(c).lower() and any(k.arg == "out_dtype" for k in c.keywords)
    ]


def _is_low_precision(expr: ast.AST) -> bool:
    """``x.weight.dtype``, ``torch.bfloat16``, ``params_dtype``-like expressions."""
    ids = pyast.identifiers(expr)
    if isinstance(expr, ast.Attribute) and expr.attr == "dtype" and "weight" in ids:
        return True
    return "bfloat16" in ids and "float32" not in ids


def _router_part(module: ast.Module) -> tuple[str, str]:
    """(PRESENT | MISSING | NA, detail) for the bf16 router output."""
    cls = _moe_class(module)
    if cls is None:
        return NA, "no MoE class setting the router dtype"
    parent_of = pyast.parents(cls)
    aiter_calls = []
    for c in pyast.calls(cls, "set_out_dtype"):
        conds = pyast.guards(c, parent_of)
        if any(pyast.mentions(g, "aiter") for g in conds) and any(
            pyast.mentions(g, BIAS) for g in conds
        ):
            aiter_calls.append(c)
    if not aiter_calls:
        # Releases without an AITER-specific router dtype: the router already
        # produces bf16 unless the expert kernel asks for fp32.
        if any(
            c.args and pyast.mentions(c.args[0], "bfloat16")
            for c in pyast.calls(cls, "set_out_dtype")
        ):
            return PRESENT, "router bf16 without AITER-specific override"
        return MISSING, "no AITER router dtype"
    if any(c.args and _is_low_precision(c.args[0]) for c in aiter_calls):
        return PRESENT, "router in gate weight dtype under AITER+bias"
    if _bias_guard(module) is not None:
        return PRESENT, "router dtype decided after weights load"
    return MISSING, "router forced to float32 under AITER+bias"


def _builder(module: ast.Module) -> tuple[ast.ClassDef, pyast.FuncDef] | None:
    for cls in pyast.classes_with_method(module, "build"):
        if "Builder" in cls.name or pyast.calls(cls, "get_mla_metadata_v1"):
            fn = pyast.method(cls, "build")
            if fn is not None:
                return cls, fn
    return None


def _metadata_part(
    cls: ast.ClassDef, build: pyast.FuncDef
) -> tuple[str, str, pyast.FuncDef, list[ast.expr]]:
    """State of the metadata cache, the function holding the key test, and the
    stateful guards of the get_mla_metadata_v1 call (or of the call of the
    helper method that makes it)."""
    for fn in pyast.reachable(cls, [build], depth=2):
        sites = pyast.calls(fn, "get_mla_metadata_v1")
        if not sites:
            continue
        holders = [(fn, sites[0])]
        if fn is not build:
            holders += [(build, c) for c in pyast.calls(build, fn.name)]
        for holder, site in holders:
            stateful = [
                g
                for g in pyast.guards(site, pyast.parents(holder))
                if any(pyast.self_attr(n) for n in ast.walk(g))
                and any(isinstance(n, ast.Compare | ast.Call) for n in ast.walk(g))
            ]
            if stateful:
                return (
                    PRESENT,
                    "get_mla_metadata_v1 skipped when inputs unchanged",
                    holder,
                    stateful,
                )
        return MISSING, "get_mla_metadata_v1 runs every build", build, []
    return NA, "builder never calls get_mla_metadata_v1", build, []


def _whole_fills(cls: ast.ClassDef, build: pyast.FuncDef) -> list[str]:
    """Persistent buffers (self attributes) zero-filled whole in build()."""
    out = []
    for fn in pyast.reachable(cls, [build], depth=2):
        for c in pyast.calls(fn):
            if pyast.call_name(c) in ("fill_", "zero_") and isinstance(c.func, ast.Attribute):
                name = pyast.self_attr(c.func.value)
                if name is not None and name not in out:
                    out.append(name)
    return out


def probe_dsv32_decode(tree: SourceTree) -> Finding:
    hardening: dict[str, bool] = {}  # probe() fills in the registered items
    model = pyast.parse(tree.read_text(DEEPSEEK))
    sparse = pyast.parse(tree.read_text(SPARSE_MLA))
    if model is None or sparse is None:
        missing_path = DEEPSEEK if model is None else SPARSE_MLA
        return Finding(NA, f"{missing_path} missing or unparsable", hardening)
    found = _builder(sparse)
    if found is None:
        return Finding(NA, f"no sparse MLA metadata builder in {SPARSE_MLA}", hardening)
    cls, build = found
    parts: dict[str, tuple[str, str]] = {}
    parts["router"] = _router_part(model)
    meta_state, meta_detail, key_fn, key_guards = _metadata_part(cls, build)
    parts["metadata-cache"] = (meta_state, meta_detail)
    fills = _whole_fills(cls, build)
    parts["tail-fills"] = (
        (MISSING, "whole-buffer fills of " + ", ".join(fills))
        if fills
        else (PRESENT, "only shrink-tail fills")
    )
    if key_guards:
        hardening["complete-metadata-key"] = _complete_key(key_fn, key_guards)
        hardening["no-reuse-without-host-seqlens"] = _host_seqlens_guard(sparse, key_fn)
    # no metadata call in the builder: no reuse for its key to harden
    metadata_na = (
        frozenset({"complete-metadata-key", "no-reuse-without-host-seqlens"})
        if meta_state == NA
        else frozenset()
    )
    hardening["bias-precision-guard"] = _bias_guard(model) is not None
    applicable = {k: v for k, v in parts.items() if v[0] != NA}
    if not applicable:
        return Finding(
            NA, "; ".join(f"{k}: {d}" for k, (_, d) in parts.items()), hardening, metadata_na
        )
    missing = [f"{k} ({d})" for k, (s, d) in applicable.items() if s != PRESENT]
    na = [f"{k} n/a ({d})" for k, (s, d) in parts.items() if s == NA]
    if missing:
        reason = "missing: " + "; ".join(missing)
        if na:
            reason += "; " + "; ".join(na)
        return Finding(ABSENT, reason, hardening, metadata_na)
    reason = "; ".join(d for _, d in applicable.values())
    if na:
        reason += "; " + "; ".join(na)
    return Finding(PRESENT, reason, hardening, metadata_na)


_QUERY_LENS = re.compile(
    r"query_start_loc|(^|_)query_lens?$|^qo_indptr|cu_seqlens_q|seg_len|(^|_)q_lens?$"
)
_CONTEXT = re.compile(r"context|num_computed|computed_tokens|prefix_len")
_BYPASS = re.compile(r"query_len|prefill|spec|decode|draft", re.I)
_CLAMPS = frozenset({"minimum", "min", "clip", "clamp", "clamp_max"})


def _key_exprs(build: pyast.FuncDef, guards: list[ast.expr]) -> list[ast.expr]:
    """Elements of the tuple compared against the cached key."""
    assigns = pyast.local_assignments(build)
    out: list[ast.expr] = []
    for g in guards:
        for node in ast.walk(g):
            if isinstance(node, ast.Compare):
                for operand in [node.left, *node.comparators]:
                    for value in [operand, *assigns.get(getattr(operand, "id", ""), [])]:
                        if isinstance(value, ast.Tuple):
                            out.extend(value.elts)
                        elif pyast.self_attr(value) is None and not isinstance(value, ast.Name):
                            out.append(value)
    return out


def _complete_key(build: pyast.FuncDef, guards: list[ast.expr]) -> bool:
    """The key covers per-request query lengths and context lengths (or seq_lens
    not clamped to topk), or the cache is bypassed for batches with more than
    one query token (an ``or`` operand about query lengths, prefills or
    speculative decode in the skip test)."""
    for g in guards:
        if isinstance(g, ast.BoolOp) and isinstance(g.op, ast.Or):
            for operand in g.values:
                if any(_BYPASS.search(i) for i in pyast.identifiers(operand)):
                    return True
    assigns = pyast.local_assignments(build)
    has_query = has_context = False
    for elt in _key_exprs(build, guards):
        ids = pyast.dataflow_ids(elt, assigns)
        unclamped = pyast.dataflow_ids(elt, assigns, stop_calls=_CLAMPS)
        if any(_QUERY_LENS.search(i) for i in ids):
            has_query = True
        if (
            any(_CONTEXT.search(i) for i in ids)
            or any("seq_len" in i for i in unclamped)
            or _seq_minus_query(elt, assigns)
        ):
            has_context = True
    return has_query and has_context


def _seq_minus_query(expr: ast.AST, assigns: dict[str, list[ast.expr]]) -> bool:
    todo, seen = [expr], set()
    while todo:
        cur = todo.pop()
        for n in ast.walk(cur):
            if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Sub):
                left = pyast.dataflow_ids(n.left, assigns)
                right = pyast.dataflow_ids(n.right, assigns)
                if any("seq_len" in i for i in left) and any(_QUERY_LENS.search(i) for i in right):
                    return True
            if isinstance(n, ast.Name) and n.id in assigns and n.id not in seen:
                seen.add(n.id)
                todo.extend(assigns[n.id])
    return False


def _host_seqlens_guard(module: ast.Module, build: pyast.FuncDef) -> bool:
    """``build`` (or a helper it calls) tests whether the host copy of seq_lens
    exists (``X is None`` / ``is not None`` on a seq_lens *cpu/host* value)."""
    for fn in pyast.reachable(module, [build], depth=2):
        assigns = pyast.local_assignments(fn)
        for node in ast.walk(fn):
            if isinstance(node, ast.Compare) and any(
                isinstance(op, ast.Is | ast.IsNot) for op in node.ops
            ):
                ids = {i.lower() for i in pyast.dataflow_ids(node.left, assigns)}
                if any("seq_len" in i for i in ids) and any("cpu" in i or "host" in i for i in ids):
                    return True
    return False


def _bias_guard(module: ast.Module) -> pyast.FuncDef | None:
    """A function run after weights load (reachable from ``load_weights`` or a
    ``process_weights_after_loading``-like function) that rounds the bias and
    compares expert selection (topk/argsort/sort/argmax) or distinct values
    (unique) before and after rounding."""
    candidates = []
    for fn in pyast.functions(module):
        low = {i.lower() for i in pyast.identifiers(fn)}
        rounds = any(pyast.call_name(c) == "to" for c in pyast.calls(fn))
        compares = any(isinstance(n, ast.Compare) for n in ast.walk(fn)) or low & {
            "equal",
            "allclose",
            "all",
            "any",
        }
        # the expert selection may sit in a helper the function calls by name
        selection = {
            i.lower()
            for helper in pyast.reachable(module, [fn], depth=1)
            for i in pyast.identifiers(helper)
        }
        if (
            any("bias" in i for i in low)
            and selection & {"topk", "argsort", "sort", "argmax", "grouped_topk", "unique"}
            and rounds
            and compares
        ):
            candidates.append(fn)
    if not candidates:
        return None
    for root in pyast.functions(module):
        if POST_LOAD.search(root.name):
            for fn in pyast.reachable(module, [root], depth=3):
                if fn in candidates:
                    return fn
    return None
