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

import importlib
from collections.abc import Callable
from typing import Any

from vllm_fork.errors import ForkError
from vllm_fork.facts import registry
from vllm_fork.facts.finding import ABSENT, NA, PRESENT, UNPROBED, Finding
from vllm_fork.facts.names import tag_for
from vllm_fork.sources.upstream import imported_sha256
from vllm_fork.sources.workspace import Workspace
from vllm_fork.sourcetree import DirTree, GitTree, SourceTree


def probe_fn(change: registry.Change) -> Callable[[SourceTree], Finding]:
    """The probe of ``change``: the registry names it ``module:function`` (a
    module of this package), so the registry stays data and imports no probe."""
    if change.local:
        return _local_probe
    module, _, name = change.probe.partition(":")
    return getattr(importlib.import_module(module), name)


def _local_probe(tree: SourceTree) -> Finding:
    return Finding(UNPROBED, "a local change (no probe): carried where its patches are")


def probe(change_id: str, tree: SourceTree) -> Finding:
    """Probe one change; raises ValueError for an unknown change id.

    The finding's hardening has the change's registered items, in registry
    order, less those the probe says the tree has no code for
    (``hardening_na``): items the probe did not report are not found; an item
    the registry does not know is a bug in the probe.
    """
    change = registry.get(change_id)
    found = probe_fn(change)(tree)
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


def base_findings(config: Workspace, version: str) -> dict[str, Any] | None:
    """Probes of the pristine base in the cache (for changes a wheel cannot show)."""
    try:
        if imported_sha256(config.upstream_repo, version) is None:
            return None
        return probe_all(GitTree(config.upstream_repo, f"refs/tags/{tag_for(version)}"))
    except (ForkError, OSError, ImportError):
        return None


__all__ = [
    "ABSENT",
    "NA",
    "PRESENT",
    "DirTree",
    "Finding",
    "GitTree",
    "SourceTree",
    "base_findings",
    "probe",
    "probe_all",
    "probe_fn",
]
