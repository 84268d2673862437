"""Decide from a vLLM source tree, without importing vLLM, whether each of the
fork's changes is present, and which of our hardening items it carries.

Python files are read with ``ast``, CUDA files with comment-aware text matching.
Every probe looks for behaviour-level structure (a dtype comparison, a cached key,
an environment switch), not for exact upstream text, so both upstream's version
of a change and ours are recognised.
"""

from __future__ import annotations

from collections.abc import Callable

from vllm_fork.probes.allreduce import probe_ar_rms_pack_gate
from vllm_fork.probes.finding import ABSENT, HARDENING, NA, PRESENT, Finding
from vllm_fork.probes.moe import probe_dsv32_decode, probe_moe_bias_precast
from vllm_fork.probes.rope import probe_rope_bf16_buffer, probe_rope_cache_dtype
from vllm_fork.probes.trees import DirTree, GitTree, SourceTree

CHANGE_IDS: tuple[str, ...] = (
    "rope-cache-dtype",
    "rope-bf16-buffer",
    "moe-bias-precast",
    "dsv32-decode",
    "ar-rms-pack-gate",
)

_PROBES: dict[str, Callable[[SourceTree], Finding]] = {
    "rope-cache-dtype": probe_rope_cache_dtype,
    "rope-bf16-buffer": probe_rope_bf16_buffer,
    "moe-bias-precast": probe_moe_bias_precast,
    "dsv32-decode": probe_dsv32_decode,
    "ar-rms-pack-gate": probe_ar_rms_pack_gate,
}


def probe(change_id: str, tree: SourceTree) -> Finding:
    """Probe one change; raises ValueError for an unknown change id."""
    try:
        fn = _PROBES[change_id]
    except KeyError:
        raise ValueError(
            f"unknown change id {change_id!r}; known: {', '.join(CHANGE_IDS)}"
        ) from None
    return fn(tree)


def probe_all(tree: SourceTree) -> dict[str, Finding]:
    """Probe every change, in CHANGE_IDS order."""
    return {cid: probe(cid, tree) for cid in CHANGE_IDS}


__all__ = [
    "ABSENT",
    "CHANGE_IDS",
    "HARDENING",
    "NA",
    "PRESENT",
    "DirTree",
    "Finding",
    "GitTree",
    "SourceTree",
    "probe",
    "probe_all",
]
