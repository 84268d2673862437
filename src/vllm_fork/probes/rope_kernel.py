"""Probe of the fork's vectorized rotary kernel (change ``rope-fast-kernel``).

Upstream's ``rotary_embedding_kernel`` runs one block per token and moves
each element with a scalar access; its template has only type parameters
(``scalar_t, cache_t, IS_NEOX``). The fork's kernel is templated on a vector
width as well (the rotary pairs one thread moves) and moves them through an
over-aligned vector type (``alignas``), and its host function returns before
any launch on an empty batch. The probe reads the comment-stripped kernel
file for those three traits, whatever the names.
"""

from __future__ import annotations

import re

from vllm_fork.facts.finding import ABSENT, NA, PRESENT, Finding
from vllm_fork.probes import cuda
from vllm_fork.probes.rope import _kernel_source as kernel_source
from vllm_fork.probes.rope import probe_rope_cache_dtype
from vllm_fork.sourcetree import SourceTree

# a kernel's template head: template <...> __global__ void name(, with launch
# bounds or an upper-case attribute macro (ROPE_LAUNCH_BOUNDS) before or after void
_ATTRIBUTE = r"(?:__launch_bounds__\s*\([^)]*\)|[A-Z][A-Z0-9_]*)\s*"
_KERNEL_HEAD = re.compile(
    rf"template\s*<(?P<params>[^{{}};]*?)>\s*__global__\s+(?:{_ATTRIBUTE})?"
    rf"void\s+(?:{_ATTRIBUTE})?(?P<name>\w+)\s*\("
)
_INT_PARAM = re.compile(
    r"^(?:const\s+)?(?:unsigned\s+)?(?:int|int64_t|size_t|long)\s+(?P<name>\w+)$"
)
_ALIGNED_TYPE = re.compile(r"\b(?:struct|class)\s+alignas\s*\(")
_EMPTY_GUARD = re.compile(r"\bif\s*\(\s*(?:\w*num_tokens\w*\s*==\s*0|0\s*==\s*\w*num_tokens\w*)")


def vector_width_params(text: str) -> dict[str, str]:
    """Rotary kernel name -> its integer template parameter, for each rotary kernel
    of comment-stripped ``text`` that has one."""
    found: dict[str, str] = {}
    for m in _KERNEL_HEAD.finditer(text):
        if "rotary" not in m.group("name"):
            continue
        for param in cuda.split_top(m.group("params")):
            im = _INT_PARAM.match(param)
            if im:
                found[m.group("name")] = im.group("name")
                break
    return found


def probe_rope_fast_kernel(tree: SourceTree) -> Finding:
    hardening: dict[str, bool] = {}
    found = kernel_source(tree)
    if found is None:
        return Finding(NA, "no rotary_embedding host function in pos_encoding_kernels.cu", {})
    path, text = found
    # the fast kernel is built on the kernel that reads the cache in its own dtype
    if probe_rope_cache_dtype(tree).state == NA:
        return Finding(
            NA,
            f"{path}: the kernel reads the cache in the query dtype (no cache_t template "
            "for the fast kernel to build on)",
            hardening,
        )
    widths = vector_width_params(text)
    aligned = bool(_ALIGNED_TYPE.search(text))
    host = next(
        (f for f in cuda.functions(text) if f.name == "rotary_embedding" and not f.is_kernel),
        None,
    )
    guarded = host is not None and bool(_EMPTY_GUARD.search(host.body))
    if widths and aligned and guarded:
        name, width = next(iter(widths.items()))
        return Finding(
            PRESENT,
            f"{path}: {name} is templated on a vector width ({width}) and moves the pairs "
            "with aligned vector accesses; an empty batch returns before any launch",
            hardening,
        )
    missing = [
        what
        for what, ok in (
            ("no vector-width template parameter", bool(widths)),
            ("no aligned vector type", aligned),
            ("no empty-batch guard in the host function", guarded),
        )
        if not ok
    ]
    return Finding(
        ABSENT, f"{path}: upstream's one-block-per-token kernel ({'; '.join(missing)})", hardening
    )
