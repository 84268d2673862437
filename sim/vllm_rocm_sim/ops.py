# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""CPU impls for vLLM's ROCm custom ops in the ROCm simulation.

vLLM registers ``torch.ops.vllm.rocm_aiter_*`` (and ``vllm_aiter::*``) for
the CUDA dispatch key only. ``register_cpu_impl(op)`` adds a CPU kernel
that forwards to the same Python function vLLM registered (found by
vLLM's naming convention ``_<op>_impl``), or to ``impl`` when given. The
CPU kernel is registered once per op and process; later calls only
change where it forwards. Every call is logged in ``RECORDER`` as
``<ns>::<op>`` before it runs.
"""

import importlib
from collections.abc import Callable

import torch

from .recorder import RECORDER

IMPL_MODULES = (
    "vllm._aiter_ops",
    "vllm.kernels.aiter_ops",
    "vllm.v1.attention.ops.rocm_aiter_mla_sparse",
)

_libraries: dict[str, torch.library.Library] = {}
_targets: dict[str, Callable | None] = {}


def qualify(op: str) -> tuple[str, str]:
    """'rocm_aiter_x' -> ('vllm', 'rocm_aiter_x'); 'ns::x' -> ('ns', 'x')."""
    ns, sep, name = op.rpartition("::")
    return (ns if sep else "vllm"), name


def default_impl(op: str) -> Callable:
    """The Python function vLLM registered for ``op`` (by naming convention)."""
    _, name = qualify(op)
    candidates = (f"_{name}_impl", f"{name}_impl", name)
    for module_name in IMPL_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            # Not every release has every module.
            if e.name is None or not f"{module_name}.".startswith(f"{e.name}."):
                raise
            continue
        for attr in candidates:
            fn = getattr(module, attr, None)
            if callable(fn):
                return fn
    raise LookupError(
        f"no Python impl found for {op!r} (looked for {candidates} in "
        f"{IMPL_MODULES}); pass impl= explicitly"
    )


def _kernel(qualname: str) -> Callable:
    def cpu_kernel(*args, **kwargs):
        target = _targets.get(qualname)
        if target is None:
            raise NotImplementedError(
                f"{qualname} has no CPU impl in the ROCm simulation; "
                "use register_cpu_impl() or the aiter_cpu_ops fixture"
            )
        RECORDER.record(qualname, args, kwargs)
        return target(*args, **kwargs)

    return cpu_kernel


def register_cpu_impl(op: str, impl: Callable | None = None) -> Callable | None:
    """Make ``op`` run on CPU tensors through ``impl`` (default: vLLM's own
    Python impl of the op). Returns the previous target (None if none)."""
    import vllm._aiter_ops  # noqa: F401  (registers the ops)

    ns, name = qualify(op)
    qualname = f"{ns}::{name}"
    if not hasattr(getattr(torch.ops, ns), name):
        raise LookupError(
            f"{qualname} is not a registered op: is the ROCm simulation "
            "active and the module defining it imported?"
        )
    previous = _targets.get(qualname)
    _targets[qualname] = impl if impl is not None else default_impl(op)
    if qualname not in _registered:
        library = _libraries.setdefault(ns, torch.library.Library(ns, "IMPL"))
        library.impl(name, _kernel(qualname), "CPU")
        _registered.add(qualname)
    return previous


def restore_cpu_impl(op: str, target: Callable | None) -> None:
    """Point ``op``'s CPU kernel back at ``target`` (a value returned by
    register_cpu_impl); None makes CPU calls fail as without the simulation."""
    ns, name = qualify(op)
    _targets[f"{ns}::{name}"] = target


_registered: set[str] = set()


def _mm_out_dtype(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype):
    # hipBLAS accumulates in float32 and writes out_dtype.
    return torch.mm(a.float(), b.float()).to(out_dtype)


_aten_cpu: torch.library.Library | None = None


def register_aten_cpu_gaps() -> None:
    """CPU kernels for the ATen overloads vLLM's ROCm paths use and CPU builds
    of torch lack: ``aten::mm.dtype`` (e.g. the router GEMM returning float32
    logits from bf16 inputs). Overloads torch already has are left alone."""
    global _aten_cpu
    if _aten_cpu is not None:
        return
    _aten_cpu = torch.library.Library("aten", "IMPL")
    if not torch._C._dispatch_has_kernel_for_dispatch_key("aten::mm.dtype", "CPU"):
        _aten_cpu.impl("mm.dtype", _mm_out_dtype, "CPU")
