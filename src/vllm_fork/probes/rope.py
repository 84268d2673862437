"""Probes for the rotary cache changes: the kernel reading the cache in its own dtype
and the bf16 cache copy for AITER."""

from __future__ import annotations

import ast
import re

from vllm_fork.facts.finding import ABSENT, NA, PRESENT, Finding
from vllm_fork.probes import cuda, pyast
from vllm_fork.sourcetree import SourceTree

KERNEL_PATHS = (
    "csrc/pos_encoding_kernels.cu",
    "csrc/libtorch_stable/pos_encoding_kernels.cu",
)
CUSTOM_OPS = "vllm/_custom_ops.py"
ROPE_BASE = "vllm/model_executor/layers/rotary_embedding/base.py"

_FP32_COPY = re.compile(r"(\.to\s*\(|::to\s*\(|\bto\s*\(|toType\s*\(|\.float\s*\(\s*\))")
_FP32_NAME = re.compile(r"kFloat(32)?\b|ScalarType::Float\b|\bfloat32\b")


# --------------------------------------------------------------------------- kernel cache dtype


def _kernel_source(tree: SourceTree) -> tuple[str, str] | None:
    for path in KERNEL_PATHS:
        text = tree.read_text(path)
        if text is not None and re.search(r"\bvoid\s+rotary_embedding\s*\(", text):
            return path, cuda.strip_comments(text)
    return None


def _cache_param(fn: cuda.CFunction) -> str | None:
    for p in fn.params:
        if "cache" in cuda.param_name(p).lower():
            return p
    return None


def _fp32_copies(host: cuda.CFunction, cache: str) -> list[str]:
    """Statements of the host function converting the whole cache to float32."""
    stmts = re.split(r"[;{}]", cuda.strip_strings(host.body))
    return [
        " ".join(s.split())
        for s in stmts
        if re.search(r"\b" + re.escape(cache) + r"\b", s)
        and _FP32_COPY.search(s)
        and _FP32_NAME.search(s)
    ]


def _bounded_dispatch(text: str) -> bool:
    """The cache element type is limited to the query type or float32: no generic
    dispatch macro over the cache dtype, and the cache dtype is compared."""
    local = cuda.defined_macros(text)
    for macro, first in cuda.macro_calls(text):
        if "cache" in first.lower() and macro not in local:
            return False
    stmts = re.split(r"[;{}]", cuda.strip_strings(text))
    # variables holding the cache's dtype, e.g. ``auto t = cos_sin_cache.scalar_type()``
    holders = {"cache"}
    for stmt in stmts:
        m = re.search(r"(\w+)\s*=\s*[^=]*cache\w*\s*\.\s*(scalar_type|dtype)\b", stmt, re.I)
        if m:
            holders.add(m.group(1))
    mention = re.compile("|".join(re.escape(h) for h in sorted(holders)), re.I)
    for stmt in stmts:
        if (
            re.search(r"[!=]=", stmt)
            and mention.search(stmt)
            and re.search(r"scalar_type|dtype|kFloat|Float", stmt)
        ):
            return True
    return False


def _guarded_raises(fn: pyast.FuncDef) -> list[set[str]]:
    """Identifier sets of the conditions under which ``fn`` rejects its input."""
    parent_of = pyast.parents(fn)
    out = []
    for node in ast.walk(fn):
        if isinstance(node, ast.Raise):
            ids: set[str] = set()
            for g in pyast.guards(node, parent_of):
                ids |= pyast.identifiers(g)
            out.append(ids)
        elif (
            isinstance(node, ast.Call) and pyast.call_name(node).startswith("_check") and node.args
        ):
            out.append(pyast.identifiers(node.args[0]))
        elif isinstance(node, ast.Assert):
            out.append(pyast.identifiers(node.test))
    return out


def _op_wrappers(tree: SourceTree) -> tuple[ast.Module | None, list[pyast.FuncDef]]:
    """vllm/_custom_ops.py and its functions calling torch.ops._C.rotary_embedding."""
    module = pyast.parse(tree.read_text(CUSTOM_OPS))
    if module is None:
        return None, []
    roots = [
        fn
        for fn in pyast.functions(module)
        if any("_C" in pyast.identifiers(c.func) for c in pyast.calls(fn, "rotary_embedding"))
    ]
    return module, roots


def _python_dtype_check(tree: SourceTree) -> bool:
    """vllm/_custom_ops.py rejects a cache of the wrong dtype and of the wrong
    device or shape before calling torch.ops._C.rotary_embedding."""
    module, roots = _op_wrappers(tree)
    if module is None:
        return False
    dtype_ok = other_ok = False
    for fn in pyast.reachable(module, roots):
        for ids in _guarded_raises(fn):
            if not any("cache" in i.lower() for i in ids):
                continue
            if "dtype" in ids:
                dtype_ok = True
            if ids & {"device", "shape", "size", "dim", "ndim", "is_cuda"}:
                other_ok = True
    return dtype_ok and other_ok


def _empty_batch_return(tree: SourceTree) -> bool:
    """The op wrapper returns before the op when the batch has no tokens: a
    ``return`` under a test comparing ``numel()`` (or a size) with 0."""
    _, roots = _op_wrappers(tree)
    for fn in roots:
        parent_of = pyast.parents(fn)
        for node in ast.walk(fn):
            if not isinstance(node, ast.Return):
                continue
            for test in pyast.guards(node, parent_of):
                zero = any(
                    isinstance(n, ast.Constant) and n.value == 0 and not isinstance(n.value, bool)
                    for n in ast.walk(test)
                )
                if zero and pyast.identifiers(test) & {"numel", "size", "shape"}:
                    return True
    return False


def probe_rope_cache_dtype(tree: SourceTree) -> Finding:
    found = _kernel_source(tree)
    hardening: dict[str, bool] = {}  # probe() fills in the registered items
    if found is None:
        return Finding(
            NA, "no rotary_embedding host function in pos_encoding_kernels.cu", hardening
        )
    path, text = found
    funcs = cuda.functions(text)
    host = next((f for f in funcs if f.name == "rotary_embedding" and not f.is_kernel), None)
    kernels = [f for f in funcs if f.is_kernel and _cache_param(f) is not None]
    if host is None or not kernels:
        return Finding(ABSENT, f"rotary embedding kernel not recognised in {path}", hardening)
    host_cache = _cache_param(host)
    cache_name = cuda.param_name(host_cache) if host_cache else "cos_sin_cache"
    copies = _fp32_copies(host, cache_name)
    kernel = kernels[0]
    cache_type = cuda.pointee_type(_cache_param(kernel) or "")
    query_decl = next((p for p in kernel.params if "query" in cuda.param_name(p)), "")
    query_type = cuda.pointee_type(query_decl)
    separate = (
        cache_type is not None and cache_type in kernel.template_types and cache_type != query_type
    )
    hardening = {
        "python-dtype-check": _python_dtype_check(tree),
        "bounded-dispatch": separate and not copies and _bounded_dispatch(text),
        "empty-batch": _empty_batch_return(tree),
    }
    if copies:
        return Finding(
            ABSENT,
            f"{path}: rotary_embedding copies the whole cache to float32 per call "
            f"({copies[0][:60]})",
            hardening,
        )
    if separate:
        return Finding(
            PRESENT,
            f"{path}: {kernel.name} reads the cache as its own template type {cache_type} "
            "(no float32 copy)",
            hardening,
        )
    if cache_type is not None and cache_type == query_type:
        return Finding(
            NA,
            f"{path}: {kernel.name} reads the cache in the query dtype ({cache_type}); "
            "no float32 copy to remove",
            hardening,
        )
    return Finding(
        ABSENT,
        f"{path}: {kernel.name} reads the cache as {cache_type}, not as its own template type",
        hardening,
    )


# --------------------------------------------------------------------------- bf16 cache copy


def _buffer_calls(cls: ast.ClassDef) -> list[tuple[pyast.FuncDef, ast.Call, str]]:
    out = []
    for fn in pyast.functions(cls):
        for c in pyast.calls(fn, "register_buffer"):
            if c.args and isinstance(c.args[0], ast.Constant) and isinstance(c.args[0].value, str):
                out.append((fn, c, c.args[0].value))
    return out


def _non_persistent(call: ast.Call) -> bool:
    for kw in call.keywords:
        if kw.arg == "persistent":
            return isinstance(kw.value, ast.Constant) and kw.value.value is False
    return len(call.args) >= 3 and isinstance(call.args[2], ast.Constant) and not call.args[2].value


def _refers(fn: ast.AST, name: str) -> bool:
    return name in pyast.identifiers(fn)


def probe_rope_bf16_buffer(tree: SourceTree) -> Finding:
    hardening: dict[str, bool] = {}  # probe() fills in the registered items
    module = pyast.parse(tree.read_text(ROPE_BASE))
    if module is None:
        return Finding(NA, f"{ROPE_BASE} missing or unparsable", hardening)
    classes = pyast.classes_with_method(module, "_match_cos_sin_cache_dtype")
    if not classes:
        return Finding(NA, f"no _match_cos_sin_cache_dtype in {ROPE_BASE}", hardening)
    cls = classes[0]
    match = pyast.method(cls, "_match_cos_sin_cache_dtype")
    assert match is not None
    extras = [
        (fn, c, name)
        for fn, c, name in _buffer_calls(cls)
        if name != "cos_sin_cache"
        and _non_persistent(c)
        and len(c.args) > 1
        and pyast.mentions(c.args[1], "bfloat16")
    ]
    if not extras:
        return Finding(
            ABSENT, f"{cls.name} registers no second non-persistent bf16 cache buffer", hardening
        )
    match_fns = pyast.reachable(module, [match], depth=2)
    used = [(fn, c, name) for fn, c, name in extras if any(_refers(m, name) for m in match_fns)]
    if not used or not any(pyast.mentions(m, "is_compiling") for m in match_fns):
        return Finding(
            ABSENT,
            f"buffer {extras[0][2]!r} is registered but _match_cos_sin_cache_dtype does not "
            "return it while compiling",
            hardening,
        )
    reg_fn, reg_call, name = used[0]
    hardening = {
        "buffer-dtype-check": _checks_buffer_dtype(match_fns, name),
        "no-unusable-buffer": _creation_guarded(module, reg_fn, reg_call),
        "recompute-consistent": _recompute_consistent(module, cls, match_fns, name),
        "refresh-in-place": _refreshed_in_place(cls, name),
    }
    return Finding(
        PRESENT,
        f"{cls.name} registers non-persistent bf16 buffer {name!r}; "
        "_match_cos_sin_cache_dtype returns it while compiling",
        hardening,
    )


def _bound_names(fns: list[pyast.FuncDef], name: str) -> set[str]:
    out = {name}
    for fn in fns:
        for var, values in pyast.local_assignments(fn).items():
            if any(name in pyast.identifiers(v) for v in values):
                out.add(var)
    return out


def _checks_buffer_dtype(fns: list[pyast.FuncDef], name: str) -> bool:
    names = _bound_names(fns, name)
    for fn in fns:
        for node in ast.walk(fn):
            if isinstance(node, ast.Compare):
                for operand in [node.left, *node.comparators]:
                    if pyast.is_dtype_attr(operand) and pyast.identifiers(operand) & names:
                        return True
    return False


def _creation_guarded(module: ast.Module, fn: pyast.FuncDef, call: ast.Call) -> bool:
    """The buffer is created only under AITER, for a non-bf16, real (not complex:
    ``is_complex`` / ``is_floating_point``) cache."""
    ids: set[str] = set()
    for g in pyast.guards(call, pyast.parents(fn)):
        ids |= pyast.identifiers(g)
        called = {pyast.call_name(c) for c in pyast.calls(g)}
        helpers = [f for f in pyast.functions(module) if f.name in called]
        for helper in pyast.reachable(module, helpers, depth=1):
            ids |= pyast.identifiers(helper)
    low = {i.lower() for i in ids}
    return (
        any("aiter" in i for i in low)
        and any("bfloat16" in i or "bf16" in i for i in low)
        and any("complex" in i or "is_floating_point" in i for i in low)
    )


def _recompute_consistent(
    module: ast.Module, cls: ast.ClassDef, match_fns: list[pyast.FuncDef], name: str
) -> bool:
    """The bf16 copy is (re)built by a helper that subclasses recomputing the cache
    can call, or _match_cos_sin_cache_dtype checks it still matches the cache."""
    for fn in pyast.functions(module):
        if fn.name in ("__init__", "_match_cos_sin_cache_dtype"):
            continue
        for c in pyast.calls(fn, "register_buffer"):
            if c.args and isinstance(c.args[0], ast.Constant) and c.args[0].value == name:
                return True
        for node in ast.walk(fn):
            if isinstance(node, ast.Assign) and any(
                pyast.self_attr(t) == name for t in node.targets
            ):
                return True
    names = _bound_names(match_fns, name)
    for fn in match_fns:
        for node in ast.walk(fn):
            if isinstance(node, ast.Compare):
                for operand in [node.left, *node.comparators]:
                    if (
                        isinstance(operand, ast.Attribute | ast.Call)
                        and pyast.identifiers(operand) & {"shape", "size", "data_ptr", "_version"}
                        and pyast.identifiers(operand) & names
                    ):
                        return True
    return False


def _refreshed_in_place(cls: ast.ClassDef, name: str) -> bool:
    """A method other than ``__init__`` copies new values into the bf16 copy
    (``<copy>.copy_(...)``) instead of only binding a new tensor to it."""
    for fn in pyast.functions(cls):
        if fn.name == "__init__":
            continue
        names = _bound_names([fn], name)
        for call in pyast.calls(fn, "copy_"):
            receiver = call.func.value if isinstance(call.func, ast.Attribute) else None
            if receiver is not None and pyast.identifiers(receiver) & names:
                return True
    return False
