"""Command-line front ends of ``vllm-fork rebase`` and ``vllm-fork matrix``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from vllm_fork.errors import ExitCode, UsageError
from vllm_fork.sources.workspace import Workspace


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
    p.add_argument(
        "--reason",
        metavar="TEXT",
        help="with --skip: why the patch is dropped (required; it goes into the review)",
    )
    p.add_argument(
        "--review",
        type=Path,
        metavar="FILE",
        help="also write the review to FILE (Markdown) and its JSON beside it "
        "(always written to DIR/.git/vllm-fork/review.{md,json})",
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


def rebase_run(args: argparse.Namespace, config: Workspace) -> int:
    from vllm_fork.rebase.engine import (
        RebaseConflict,
        abort_rebase,
        continue_rebase,
        start_rebase,
    )
    from vllm_fork.rebase.report import old_series_names, summary_table

    def log(line: str) -> None:
        print(line, flush=True)

    if args.cont or args.abort or args.skip:
        if args.from_version or args.onto_version:
            raise UsageError("--continue, --skip and --abort take no --from/--onto")
    elif not (args.from_version and args.onto_version):
        raise UsageError("give --from V1 --onto V2, or --continue, --skip or --abort")
    if args.reason is not None and not args.skip:
        raise UsageError("--reason goes with --skip (why the patch is dropped)")
    if args.skip and not (args.reason or "").strip():
        raise UsageError(
            'say why the patch is dropped: `vllm-fork rebase --skip --reason "TEXT"` '
            "(the rebase review records it; nothing was changed)"
        )
    if args.review is not None and not (args.from_version and args.onto_version):
        raise UsageError("--review goes with --from/--onto (it is kept for --continue)")
    try:
        if args.abort:
            abort_rebase(config, args.dir, log=log)
            return ExitCode.OK
        if args.cont or args.skip:
            result = continue_rebase(
                config, args.dir, skip=args.skip, reason=args.reason or "", log=log
            )
        else:
            result = start_rebase(
                config,
                args.from_version,
                args.onto_version,
                args.dir,
                force_series=args.force_series,
                review=args.review,
                log=log,
            )
    except RebaseConflict as exc:
        print(str(exc))
        return ExitCode.FAILED
    state = result.state
    print()
    print(summary_table(state, old_series_names(state)))
    print()
    print(
        f"{args.dir}: {state.branch.removeprefix('refs/heads/')} is now on upstream "
        f"{state.onto_version} (before: {state.backup_ref})"
    )
    print(
        f"{state.series_dir}: {len(result.written)} file(s) written, {len(result.removed)} removed"
    )
    for path in result.review:
        print(f"review: {path}")
    return ExitCode.OK


def matrix_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--releases",
        nargs="+",
        metavar="V",
        help="pinned releases to check (default: every pinned release from the "
        "oldest to the newest supported base)",
    )
    p.add_argument(
        "--series",
        metavar="V",
        help="apply series/V to every release, as a rebase of it would meet them "
        "(default: each release's own series)",
    )
    p.add_argument(
        "--default-series",
        action="store_true",
        help="apply the default base's series to every release (--series of the default base)",
    )
    p.add_argument(
        "--json",
        type=Path,
        metavar="FILE",
        help="also write the matrix as JSON to FILE; '-': the JSON alone on stdout "
        "(the table then goes to stderr)",
    )
    p.add_argument("--no-cache", action="store_true", help="recompute every row")
    p.add_argument(
        "--fetch",
        action="store_true",
        help="fetch the releases the matrix, its known issues and its drift part read that "
        "are not in the cache (default: they are named as not covered)",
    )


def matrix_run(args: argparse.Namespace, config: Workspace) -> int:
    from vllm_fork.release.overview import compute_overview

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    if args.series and args.default_series:
        raise UsageError("give --series V or --default-series, not both")
    overview = compute_overview(
        config,
        args.releases,
        args.series,
        own=not (args.series or args.default_series),
        use_cache=not args.no_cache,
        log=log,
        fetch=args.fetch,
    )
    to_stdout = args.json is not None and str(args.json) == "-"
    # stdout carries one result: the JSON when asked for there, else the tables
    print(overview.format(), file=sys.stderr if to_stdout else sys.stdout)
    if to_stdout:
        print(json.dumps(overview.to_json(), indent=2, sort_keys=True))
    elif args.json is not None:
        overview.write_json(args.json)
    return ExitCode.FAILED if overview.matrix.unavailable else ExitCode.OK
