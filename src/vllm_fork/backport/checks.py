"""The checks `vllm-fork backport` runs on each base it carries a commit to: the
base's fork tests and the prove-fail of the new patch, in its tree venv."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from pathlib import Path

from vllm_fork.backport.carry import CheckRunner, Checks
from vllm_fork.sources.workspace import Workspace
from vllm_fork.testing import treevenv
from vllm_fork.testing.forktests import check_head, sim_plugin_args


def fork_checks(python_for: Callable[[Path], str], *, exclusive: bool = False) -> CheckRunner:
    """The backport's check runner: the base's fork tests and the prove-fail of
    the patch at HEAD (or the commit ``rev``), with the interpreter ``python_for(tree)`` gives.
    ``exclusive``: one base's checks at a time (for an interpreter shared by
    every base and reinstalled per tree, as the tree venv is)."""
    gate: contextlib.AbstractContextManager = (
        threading.Lock() if exclusive else contextlib.nullcontext()
    )

    def run(version: str, tree: Path, rev: str = "HEAD") -> Checks:
        with gate:
            tests, proof = check_head(tree, python_for(tree), sim_plugin_args(tree), rev)
        verdict = proof.verdict if proof is not None else "no proof (not a series commit)"
        ok = tests.green and proof is not None and (proof.ok or not proof.counts)
        return Checks(tests.summary(), verdict, ok)

    return run


def tree_venv_checks(config: Workspace, torch: str | None) -> CheckRunner:
    """:func:`fork_checks` in the tool's tree venv (shared by every base and
    reinstalled per tree: one base's checks at a time)."""

    def python_for(tree: Path) -> str:
        return str(treevenv.ensure_tree_venv(config, tree, torch))

    return fork_checks(python_for, exclusive=True)
