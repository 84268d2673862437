"""``vllm-fork watch``: upstream's changes to the fork's code, per base, and what is
left to triage (the work is vllm_fork.reports.watch)."""

from __future__ import annotations

import argparse
from pathlib import Path

from vllm_fork.errors import ExitCode
from vllm_fork.reports.watch import format_watch, watch, write_json
from vllm_fork.sources.workspace import Workspace


def watch_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--aiter-repo",
        metavar="DIR|URL",
        help="a clone of ROCm/aiter (a URL is cloned into the cache: network)",
    )
    p.add_argument(
        "--vllm-repo",
        metavar="DIR|URL",
        help="a clone of upstream vLLM: also watch the commits after the newest pinned release",
    )
    p.add_argument(
        "--vllm-since",
        metavar="REV",
        help="the commit of the newest pinned release in --vllm-repo (default: its tag vV)",
    )
    p.add_argument(
        "--fetch",
        action="store_true",
        help="download and import the pinned releases missing from the cache (network)",
    )
    p.add_argument("--all", action="store_true", help="list the triaged candidates too")
    p.add_argument("--json", type=Path, metavar="FILE", help="write the report as JSON")


def watch_run(args: argparse.Namespace, config: Workspace) -> int:
    report = watch(
        config,
        vllm_repo=args.vllm_repo,
        vllm_since=args.vllm_since,
        aiter_repo=args.aiter_repo,
        fetch=args.fetch,
    )
    print(format_watch(report, show_all=args.all))
    if args.json:
        write_json(report, args.json)
    return ExitCode.OK if report.ok else ExitCode.FAILED
