"""``vllm-fork known-issues``: register entries on every base, from the cache (the
work is vllm_fork.reports.register)."""

from __future__ import annotations

import argparse

from vllm_fork.errors import ExitCode
from vllm_fork.reports.register import format_issue_rows, issue_rows
from vllm_fork.sources.workspace import Workspace


def known_issues_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "ids", nargs="*", metavar="ID", help="entries of known-issues.toml (default: all)"
    )
    p.add_argument("--reasons", action="store_true", help="each cell's reason, per base")


def known_issues_run(args: argparse.Namespace, config: Workspace) -> int:
    rows, missing = issue_rows(config, args.ids)
    print(format_issue_rows(rows, missing, reasons=args.reasons or bool(args.ids)))
    return ExitCode.OK
