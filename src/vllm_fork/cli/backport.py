"""Command-line front end of ``vllm-fork backport``."""

from __future__ import annotations

import argparse
from pathlib import Path

from vllm_fork.backport.carry import carry_commit, format_report, write_json
from vllm_fork.backport.checks import tree_venv_checks
from vllm_fork.sources.workspace import Workspace


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
    report = carry_commit(
        config,
        tree=args.tree,
        commit=args.commit,
        patch=args.patch,
        from_version=args.from_version,
        bases=args.bases,
        checks=tree_venv_checks(config, args.torch),
        jobs=args.jobs,
        restart=args.restart,
    )
    print(format_report(report), flush=True)
    if args.json is not None:
        write_json(report, args.json)
    return 0 if report.ok else 1
