"""Command-line front ends of ``vllm-fork rebase`` and ``vllm-fork matrix``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from vllm_fork.errors import ExitCode, ForkError, SeriesError, UsageError
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


def _issue_states(config: Workspace, versions: list[str], log) -> dict:
    """Per release, the known-issue states with its own series (or why not)."""
    from vllm_fork.reports.status import base_issue_states

    out: dict = {}
    if not config.known_issues:
        return out
    for version in versions:
        log(f"matrix: {version}: known issues")
        try:
            out[version] = base_issue_states(config, version)
        except SeriesError:
            raise
        except ForkError as exc:
            out[version] = f"not probed: {exc}"
    return out


def matrix_run(args: argparse.Namespace, config: Workspace) -> int:
    from vllm_fork.reports.drift import compute_drift, format_drift
    from vllm_fork.reports.matrix import compute_matrix, format_matrix
    from vllm_fork.reports.status import format_issue_matrix

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    if args.series and args.default_series:
        raise UsageError("give --series V or --default-series, not both")
    projected = bool(args.series or args.default_series)
    matrix = compute_matrix(
        config,
        args.releases,
        args.series,
        own=not projected,
        use_cache=not args.no_cache,
        log=log,
    )
    from vllm_fork.release.check import format_last_checks, last_checks

    versions = [row.version for row in matrix.rows]
    to_stdout = args.json is not None and str(args.json) == "-"
    # stdout carries one result: the JSON when asked for there, else the tables
    table_out = sys.stderr if to_stdout else sys.stdout
    print(format_matrix(matrix), file=table_out)
    print("\nOwn series and last release check (`vllm-fork release-check`):\n", file=table_out)
    print(format_last_checks(config, versions), file=table_out)
    issues = _issue_states(config, versions, log)
    if config.known_issues:
        print(
            "\nKnown issues, each release with its own series (known-issues.toml):\n",
            file=table_out,
        )
        print(format_issue_matrix(tuple(i.id for i in config.known_issues), issues), file=table_out)
    drift = compute_drift(config)
    print(
        "\nDrift: each logical patch on each base against its newest copy "
        "(`vllm-fork status --drift`):\n",
        file=table_out,
    )
    print(format_drift(drift), file=table_out)
    if args.json:
        data = matrix.to_json()
        data["drift"] = drift.to_json()
        checks = last_checks(config)
        data["release_check"] = {v: checks.get(v) for v in versions}
        data["known_issues"] = {
            v: got if isinstance(got, str) else {s.issue: s.to_json() for s in got}
            for v, got in issues.items()
        }
        text = json.dumps(data, indent=2, sort_keys=True) + "\n"
        if to_stdout:
            sys.stdout.write(text)
        else:
            args.json.write_text(text)
    return ExitCode.FAILED if matrix.unavailable else ExitCode.OK
