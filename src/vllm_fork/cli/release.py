"""Command-line front ends of ``vllm-fork release-check`` and ``vllm-fork update``."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from vllm_fork.errors import ExitCode
from vllm_fork.sources.workspace import Workspace


def release_check_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--bases",
        nargs="+",
        metavar="V",
        help="pinned bases to check (default: every supported base and every base with a series)",
    )
    p.add_argument(
        "--shard",
        metavar="I/N",
        help="check shard I of N of those bases (every N-th base from the I-th, oldest first)",
    )
    p.add_argument(
        "--out-dir",
        type=Path,
        metavar="DIR",
        help="also write each base's result to DIR/<V>.json (`vllm-fork release-merge` "
        "combines them)",
    )
    p.add_argument("--json", type=Path, metavar="FILE", help="also write the summary as JSON")
    p.add_argument(
        "--markdown", type=Path, metavar="FILE", help="also write the summary table as Markdown"
    )
    p.add_argument("--force", action="store_true", help="redo bases whose result is recorded")
    p.add_argument(
        "--no-wheel",
        action="store_true",
        help="skip the precompiled wheel build, its install check and the tool's release "
        "tests (they build the default base)",
    )
    p.add_argument(
        "--torch",
        metavar="SPEC",
        help="torch requirement of the test venv (default: $TREE_TORCH or the CPU build "
        "the tool names)",
    )


def release_check_run(args: argparse.Namespace, config: Workspace) -> int:
    from vllm_fork.release.check import parse_shard, release_check

    shard = parse_shard(args.shard) if args.shard else None
    report = release_check(
        config,
        args.bases,
        torch=args.torch,
        wheel=not args.no_wheel,
        force=args.force,
        shard=shard,
        out_dir=args.out_dir,
    )
    return _report(report, args)


def _report(report: Any, args: argparse.Namespace) -> int:
    from vllm_fork.release.check import format_report, write_report_files

    print(format_report(report))
    write_report_files(report, markdown=args.markdown, json_file=args.json)
    return ExitCode.OK if report.passed else ExitCode.FAILED


def release_merge_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "results",
        nargs="+",
        type=Path,
        metavar="RESULT",
        help="per-base result files or directories of them (release-check --out-dir)",
    )
    p.add_argument(
        "--bases",
        nargs="+",
        metavar="V",
        help="the bases expected (default: every base release-check checks); "
        "those without a result are missing",
    )
    p.add_argument("--json", type=Path, metavar="FILE", help="also write the summary as JSON")
    p.add_argument(
        "--markdown", type=Path, metavar="FILE", help="also write the summary table as Markdown"
    )


def release_merge_run(args: argparse.Namespace, config: Workspace) -> int:
    from vllm_fork.release.merge import merge_results

    return _report(merge_results(config, args.results, args.bases), args)


def update_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--dir",
        type=Path,
        metavar="DIR",
        help="work tree for the rebase (default: work/update-<NEW> in the repository)",
    )
    p.add_argument("--json", type=Path, metavar="FILE", help="report as JSON (default: DIR/..)")
    p.add_argument("--markdown", type=Path, metavar="FILE", help="report as Markdown")
    p.add_argument(
        "--torch", metavar="SPEC", help="torch requirement of the test venv (as release-check)"
    )


def update_run(args: argparse.Namespace, config: Workspace) -> int:
    from vllm_fork.release.update import format_update, update

    report = update(config, work_dir=args.dir, torch=args.torch)
    print(format_update(report))
    markdown, json_path = report.write_files(config, markdown=args.markdown, json_file=args.json)
    print(f"\nreport: {markdown} {json_path}")
    return report.exit_code


def ci_workflows_args(p: argparse.ArgumentParser) -> None:
    what = p.add_mutually_exclusive_group()
    what.add_argument("--write", action="store_true", help="write the files that differ")
    what.add_argument(
        "--check",
        action="store_true",
        help="exit 1 (with the diff) when a committed file differs from the generated one",
    )


def ci_workflows_run(args: argparse.Namespace, config: Workspace) -> int:
    from vllm_fork.release import workflows

    if args.check:
        diffs = workflows.drift(config)
        for diff in diffs:
            print(diff)
        if diffs:
            print("the CI files differ from bases.toml's: run `vllm-fork ci-workflows --write`")
            return ExitCode.FAILED
        print("the CI files are up to date")
        return ExitCode.OK
    if args.write:
        written = workflows.write(config)
        for rel in written:
            print(f"wrote {rel}")
        if not written:
            print("the CI files are up to date")
        return ExitCode.OK
    for line in workflows.job_list(config):
        print(line)
    return ExitCode.OK
