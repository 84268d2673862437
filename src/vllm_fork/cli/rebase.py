"""Command-line front ends of ``vllm-fork rebase`` and ``vllm-fork matrix``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from vllm_fork.config import Config
from vllm_fork.errors import UsageError


def rebase_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--from", dest="from_version", metavar="V1", help="the tree's base")
    p.add_argument("--onto", dest="onto_version", metavar="V2", help="the new base (pinned)")
    action = p.add_mutually_exclusive_group()
    action.add_argument(
        "--continue",
        dest="cont",
        action="store_true",
        help="go on after resolving a conflict (staged or committed)",
    )
    action.add_argument(
        "--skip",
        action="store_true",
        help="drop the patch that stopped on a conflict (upstream has it) and go on",
    )
    action.add_argument(
        "--abort",
        action="store_true",
        help="stop and put the work tree back as it was before the rebase",
    )
    p.add_argument("--force-series", action="store_true", help="replace an existing series/<V2>/")
    p.add_argument(
        "dir",
        type=Path,
        nargs="?",
        default=Path("."),
        metavar="DIR",
        help="work tree of V1 (a new or empty DIR gets V1 materialized; default: .)",
    )


def rebase_run(args: argparse.Namespace, config: Config) -> int:
    from vllm_fork.rebase.engine import (
        RebaseConflict,
        abort_rebase,
        continue_rebase,
        old_series_names,
        start_rebase,
        summary_table,
    )

    def log(line: str) -> None:
        print(line, flush=True)

    if args.cont or args.abort or args.skip:
        if args.from_version or args.onto_version:
            raise UsageError("--continue, --skip and --abort take no --from/--onto")
    elif not (args.from_version and args.onto_version):
        raise UsageError("give --from V1 --onto V2, or --continue, --skip or --abort")
    try:
        if args.abort:
            abort_rebase(config, args.dir, log=log)
            return 0
        if args.cont or args.skip:
            result = continue_rebase(config, args.dir, skip=args.skip, log=log)
        else:
            result = start_rebase(
                config,
                args.from_version,
                args.onto_version,
                args.dir,
                force_series=args.force_series,
                log=log,
            )
    except RebaseConflict as exc:
        print(str(exc))
        return 1
    state = result.state
    print()
    print(summary_table(state, old_series_names(state)))
    print()
    print(
        f"{args.dir}: {state.branch.removeprefix('refs/heads/')} is now on upstream "
        f"{state.onto_version} (before: {state.backup_ref})"
    )
    print(
        f"series/{state.onto_version}: {len(result.written)} file(s) written, "
        f"{len(result.removed)} removed"
    )
    for name in result.old_series_updated:
        print(f"series/{state.from_version}/{name}: Applied-Upstream: {state.onto_version}")
    return 0


def matrix_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--releases",
        nargs="+",
        metavar="V",
        help="pinned releases to check (default: every pinned release from the "
        "oldest to the newest supported base)",
    )
    p.add_argument(
        "--series", metavar="V", help="the series to check (default: the default base's)"
    )
    p.add_argument("--json", type=Path, metavar="FILE", help="also write the matrix as JSON")
    p.add_argument("--no-cache", action="store_true", help="recompute every row")


def matrix_run(args: argparse.Namespace, config: Config) -> int:
    from vllm_fork.rebase.matrix import compute_matrix, format_matrix

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    matrix = compute_matrix(
        config, args.releases, args.series, use_cache=not args.no_cache, log=log
    )
    print(format_matrix(matrix))
    if args.json:
        text = json.dumps(matrix.to_json(), indent=2, sort_keys=True) + "\n"
        if str(args.json) == "-":
            sys.stdout.write(text)
        else:
            args.json.write_text(text)
    return 1 if matrix.unavailable else 0
