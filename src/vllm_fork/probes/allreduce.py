"""Probe for the pack-size gate of the 1-stage AITER fused allreduce+RMSNorm kernel."""

from __future__ import annotations

import ast

from vllm_fork.facts.finding import ABSENT, NA, PRESENT, Finding
from vllm_fork.probes import pyast
from vllm_fork.sourcetree import SourceTree

AITER_OPS = "vllm/_aiter_ops.py"
IMPL = "_rocm_aiter_fused_allreduce_rmsnorm_impl"
# Files that may hold the 1-stage gate the impl delegates to (0.33.0 moved it).
GATE_FILES = ("vllm/distributed/device_communicators/aiter_custom_all_reduce.py",)
WHITELIST = {512, 1024, 2048, 4096, 7168}
# An environment variable read by the gate whose name holds one of these words
# is taken as the switch that forces the 2-stage kernel.
SWITCH_WORDS = ("STAGE", "SHOT")


def _gate_functions(tree: SourceTree, module: ast.Module) -> list[tuple[ast.Module, pyast.FuncDef]]:
    impl = pyast.find_function(module, IMPL)
    assert impl is not None
    out = [(module, fn) for fn in pyast.reachable(module, [impl], depth=3)]
    called = {pyast.call_name(c) for _, fn in out for c in pyast.calls(fn)}
    for path in GATE_FILES:
        other = pyast.parse(tree.read_text(path))
        if other is None:
            continue
        roots = [fn for fn in pyast.functions(other) if fn.name in called]
        out += [(other, fn) for fn in pyast.reachable(other, roots, depth=2)]
    return out


def _has_whitelist(fn: pyast.FuncDef) -> bool:
    for node in ast.walk(fn):
        if isinstance(node, ast.Compare) and any(isinstance(o, ast.In) for o in node.ops):
            for c in node.comparators:
                if isinstance(c, ast.Tuple | ast.List | ast.Set):
                    values = {e.value for e in c.elts if isinstance(e, ast.Constant)}
                    if len(values & WHITELIST) >= 3:
                        return True
    return False


def _is_sixteen(node: ast.AST) -> bool:
    """The literal 16, or a named constant such as ``PACK_BYTES``."""
    if isinstance(node, ast.Constant):
        return node.value == 16
    return any("PACK" in i.upper() or "BYTES" in i.upper() for i in pyast.identifiers(node))


def _has_pack_rule(fn: pyast.FuncDef) -> bool:
    """``16 // x.element_size()`` (or ``itemsize``) and a ``%`` test on hidden size."""
    pack = modulo = False
    for node in ast.walk(fn):
        if (
            isinstance(node, ast.BinOp)
            and isinstance(node.op, ast.FloorDiv)
            and _is_sixteen(node.left)
            and pyast.identifiers(node.right) & {"element_size", "itemsize"}
        ):
            pack = True
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
            modulo = True
    return pack and modulo


def _env_closure(module: ast.Module, fns: list[pyast.FuncDef]) -> set[str]:
    """Environment names read by ``fns`` directly or through names they use that
    are assigned (module/class level or in other functions) from the environment."""
    names = set()
    for fn in fns:
        names |= pyast.env_names(fn)
    used = set().union(*(pyast.identifiers(fn) for fn in fns)) if fns else set()
    for node in ast.walk(module):
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            tnames = {
                t.id if isinstance(t, ast.Name) else t.attr
                for t in targets
                if isinstance(t, ast.Name | ast.Attribute)
            }
            if tnames & used and node.value is not None:
                names |= pyast.env_names(node.value)
    for fn in pyast.functions(module):
        if fn.name in used and fn not in fns:
            names |= pyast.env_names(fn)
    return names


def probe_ar_rms_pack_gate(tree: SourceTree) -> Finding:
    hardening: dict[str, bool] = {}  # probe() fills in the registered items
    module = pyast.parse(tree.read_text(AITER_OPS))
    if module is None or pyast.find_function(module, IMPL) is None:
        return Finding(NA, f"no {IMPL} in {AITER_OPS} (no fused allreduce+RMSNorm op)", hardening)
    gates = _gate_functions(tree, module)
    envs = set()
    by_module: dict[int, tuple[ast.Module, list[pyast.FuncDef]]] = {id(module): (module, [])}
    for mod, fn in gates:
        by_module.setdefault(id(mod), (mod, []))[1].append(fn)
    # A gate in the communicator may ask rocm_aiter_ops (in _aiter_ops.py)
    # whether the switch is on: follow names used in one module into the others.
    used = set().union(*(pyast.identifiers(fn) for _, fn in gates)) if gates else set()
    for mod, fns in by_module.values():
        extra = [fn for fn in pyast.functions(mod) if fn.name in used and fn not in fns]
        envs |= _env_closure(mod, fns + extra)
    hardening["two-stage-switch"] = any(w in e.upper() for e in envs for w in SWITCH_WORDS)
    whitelist = [fn.name for _, fn in gates if _has_whitelist(fn)]
    pack = [fn.name for _, fn in gates if _has_pack_rule(fn)]
    if whitelist:
        return Finding(
            ABSENT, f"1-stage gate uses the hidden-size whitelist in {whitelist[0]}()", hardening
        )
    if pack:
        return Finding(
            PRESENT, f"1-stage gate uses the 16-byte pack-size rule in {pack[0]}()", hardening
        )
    return Finding(ABSENT, f"no pack-size rule found for the 1-stage gate of {IMPL}", hardening)
