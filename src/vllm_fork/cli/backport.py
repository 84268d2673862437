"""Command-line front end of ``vllm-fork backport``."""

from __future__ import annotations

import argparse
import contextlib
import json
import threading
from collections.abc import Callable
from pathlib import Path

from vllm_fork.errors import UsageError
from vllm_fork.rebase.backport import (
    CheckRunner,
    Checks,
    backport,
    format_report,
    select_targets,
    source_from_patch,
    source_from_tree,
)
from vllm_fork.release.treevenv import ensure_tree_venv
from vllm_fork.sources.workspace import Workspace
from vllm_fork.testing.forktests import check_head, sim_plugin_args


def fork_checks(python_for: Callable[[Path], str], *, exclusive: bool = False) -> CheckRunner:
    """The backport's check runner: the base's fork tests and the prove-fail of
    the patch at HEAD, with the interpreter ``python_for(tree)`` gives.
    ``exclusive``: one base's checks at a time (for an interpreter shared by
    every base and reinstalled per tree, as the tree venv is)."""
    gate: contextlib.AbstractContextManager = (
        threading.Lock() if exclusive else contextlib.nullcontext()
    )

    def run(version: str, tree: Path) -> Checks:
        with gate:
            tests, proof = check_head(tree, python_for(tree), sim_plugin_args(tree))
        verdict = proof.verdict if proof is not None else "no proof (not a series commit)"
        ok = tests.green and proof is not None and (proof.ok or not proof.counts)
        return Checks(tests.summary(), verdict, ok)

    return run


def backport_args(p: argparse.ArgumentParser) -> None:
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument(
        "--tree",
        type=Path,
        metavar="DIR",
        help="the materialized work tree of the base the commit was made on",
    )
    what.add_argument(
        "--patch",
        metavar="ID",
        help="a patch a series carries: its Fork-Patch id, or its subject",
    )
    p.add_argument("--commit", default="HEAD", metavar="REV", help="with --tree (default HEAD)")
    p.add_argument(
        "--from",
        dest="from_version",
        metavar="V",
        help="with --patch: the base whose version of the patch is carried (default: the newest)",
    )
    p.add_argument(
        "--bases",
        nargs="+",
        metavar="V",
        help="the bases to carry it to (default: every base with a series)",
    )
    p.add_argument(
        "--jobs",
        type=int,
        metavar="N",
        help="bases worked on at once (default: the CPUs this process may use)",
    )
    p.add_argument(
        "--torch",
        metavar="SPEC",
        help="torch requirement of the test venv (as release-check)",
    )
    p.add_argument(
        "--restart", action="store_true", help="forget an interrupted run of the same commit"
    )
    p.add_argument("--json", type=Path, metavar="FILE", help="also write the report as JSON")


def backport_run(args: argparse.Namespace, config: Workspace) -> int:
    if args.jobs is not None and args.jobs < 1:
        raise UsageError("--jobs must be at least 1")
    if args.from_version and not args.patch:
        raise UsageError("--from goes with --patch")
    targets = select_targets(config, args.bases)
    if args.tree is not None:
        source, state_dir = source_from_tree(config, args.tree, args.commit)
    else:
        # the patch is looked for on every base with a series, not only the targets
        holders = select_targets(config, None)
        source, state_dir = source_from_patch(config, args.patch, holders, args.from_version)

    def python_for(tree: Path) -> str:
        return str(ensure_tree_venv(config, tree, args.torch))

    # the tree venv is shared by every base and reinstalled per tree: one base's checks at once
    checks = fork_checks(python_for, exclusive=True)
    report = backport(
        config, source, state_dir, targets, checks, jobs=args.jobs, restart=args.restart
    )
    print(format_report(report), flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps(report.to_json(), indent=2) + "\n")
    return 0 if report.ok else 1
