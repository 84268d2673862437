"""Decide from a vLLM source tree, without importing vLLM, whether each of the
fork's changes is present, and which of our hardening items it carries.

Python files are read with ``ast``, CUDA files with comment-aware text matching.
Every probe looks for behaviour-level structure (a dtype comparison, a cached key,
an environment switch), not for exact upstream text, so both upstream's version
of a change and ours are recognised.

Which probe decides which change, and the change's hardening items, come
from the change registry (vllm_fork.facts.registry).
"""

from __future__ import annotations

from vllm_fork.facts import registry
from vllm_fork.facts.finding import ABSENT, NA, PRESENT, Finding
from vllm_fork.sourcetree import DirTree, GitTree, SourceTree


def probe(change_id: str, tree: SourceTree) -> Finding:
    """Probe one change; raises ValueError for an unknown change id.

    The finding's hardening has the change's registered items, in registry
    order, less those the probe says the tree has no code for
    (``hardening_na``): items the probe did not report are not found; an item
    the registry does not know is a bug in the probe.
    """
    change = registry.get(change_id)
    found = change.probe_fn()(tree)
    unknown = (set(found.hardening) | found.hardening_na) - set(change.hardening_ids)
    if unknown:
        raise ValueError(
            f"probe of {change_id} reports unregistered hardening item(s): "
            + ", ".join(sorted(unknown))
        )
    hardening = {
        item: bool(found.hardening.get(item, False))
        for item in change.hardening_ids
        if item not in found.hardening_na
    }
    return Finding(found.state, found.reason, hardening, found.hardening_na)


def probe_all(tree: SourceTree) -> dict[str, Finding]:
    """Probe every registered change, in registry order."""
    return {cid: probe(cid, tree) for cid in registry.change_ids()}


__all__ = [
    "ABSENT",
    "NA",
    "PRESENT",
    "DirTree",
    "Finding",
    "GitTree",
    "SourceTree",
    "probe",
    "probe_all",
]
