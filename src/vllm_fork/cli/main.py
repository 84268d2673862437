"""Command line: ``vllm-fork SUBCOMMAND ...``.

Subcommands live in :data:`COMMANDS`, a table of name -> (help, add_arguments,
run); a later subcommand is one more entry. Each command gets the one
:class:`~vllm_fork.sources.workspace.Workspace` of its run (pins, series, cache
layout and fetcher, each loaded once) and passes it down.

The CLI is the top layer (docs/architecture.md): it may import every package.
A subcommand's ``run`` imports the modules that implement it inside the
function, so that ``vllm-fork --help`` and every other command do not load
them; these lazy subcommand imports are the only function-level imports of the
tool's own modules (tests/test_layers.py checks the rest of the package).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from vllm_fork import __version__, log
from vllm_fork.cli import build as cli_build
from vllm_fork.cli import deploy as cli_deploy
from vllm_fork.cli.backport import backport_args, backport_run
from vllm_fork.cli.known_issues import known_issues_args, known_issues_run
from vllm_fork.cli.rebase import matrix_args, matrix_run, rebase_args, rebase_run
from vllm_fork.cli.release import (
    ci_workflows_args,
    ci_workflows_run,
    release_check_args,
    release_check_run,
    release_merge_args,
    release_merge_run,
    update_args,
    update_run,
)
from vllm_fork.cli.watch import watch_args, watch_run
from vllm_fork.config import ENV_CACHE
from vllm_fork.errors import ExitCode, ForkError, UsageError
from vllm_fork.sources.workspace import Workspace, load_config


@dataclass(frozen=True)
class Command:
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace, Workspace], int]


def _workspace(args: argparse.Namespace) -> Workspace:
    return load_config(offline=args.offline)


# --- pin ---------------------------------------------------------------------------


def _pin_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("versions", nargs="+", metavar="VERSION", help="vLLM release(s) to pin")
    p.add_argument("--supported", action="store_true", help="mark as a supported base")
    p.add_argument("--default", action="store_true", help="make it the default base")
    rocm = p.add_argument_group(
        "ROCm wheel",
        "pin upstream's ROCm wheel of one pinned base instead (what `build --device rocm` reuses)",
    )
    src = rocm.add_mutually_exclusive_group()
    src.add_argument(
        "--rocm-index",
        metavar="URL|DIR",
        help="PEP 503 simple index (upstream's ROCm wheel index or your mirror) or a local "
        "directory of wheels",
    )
    src.add_argument("--rocm-wheel", type=Path, metavar="FILE", help="a ROCm wheel you have")
    rocm.add_argument(
        "--rocm-variant", metavar="rocmNNN", help="the ROCm variant (required when several)"
    )
    rocm.add_argument(
        "--rocm-python", default="cp312", metavar="TAG", help="Python tag (default: cp312)"
    )


def _pin_run(args: argparse.Namespace, config: Workspace) -> int:
    from vllm_fork.sources.pinner import pin_versions

    if args.rocm_index or args.rocm_wheel:
        from vllm_fork.sources.rocm import pin_rocm

        if len(args.versions) != 1 or args.supported or args.default:
            raise UsageError("a ROCm wheel is pinned for one base at a time, without flags")
        _, pin = pin_rocm(
            config,
            config.fetcher,
            args.versions[0],
            index=args.rocm_index,
            wheel=args.rocm_wheel,
            python=args.rocm_python,
            variant=args.rocm_variant,
        )
        print(
            f"{args.versions[0]}: {pin.filename} ({pin.variant}, ROCm {pin.rocm}, {pin.python}) "
            f"sha256 {pin.sha256}"
        )
        return ExitCode.OK
    if args.rocm_variant:
        raise UsageError("--rocm-variant goes with --rocm-index or --rocm-wheel")
    pins = pin_versions(
        config, config.fetcher, args.versions, supported=args.supported, default=args.default
    )
    for version in args.versions:
        base = pins.get(version)
        wheel = base.wheel.filename if base.wheel else "(no x86_64 wheel)"
        print(f"{base.version}: {base.sdist.filename} {wheel}")
    return ExitCode.OK


# --- fetch -------------------------------------------------------------------------


def _fetch_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--base", metavar="VERSION", help="pinned base (default: bases.toml default)")
    p.add_argument("--wheel", action="store_true", help="also fetch upstream's x86_64 wheel")


def _fetch_run(args: argparse.Namespace, config: Workspace) -> int:
    from vllm_fork.sources.upstream import ensure_upstream

    base = config.base(args.base)
    fetcher = config.fetcher
    print(fetcher.ensure(base.sdist))
    ensure_upstream(config, base, fetcher)
    if args.wheel:
        if base.wheel is None:
            raise ForkError(f"bases.toml pins no wheel for {base.version}")
        print(fetcher.ensure(base.wheel))
    return ExitCode.OK


# --- materialize -------------------------------------------------------------------


def _materialize_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--base", metavar="VERSION", help="pinned base (default: bases.toml default)")
    p.add_argument(
        "--keep-failed",
        action="store_true",
        help="on a failing patch keep DIR at the last patch that applied",
    )
    _allow_unsupported_arg(p)
    p.add_argument("dir", type=Path, metavar="DIR", help="new (or empty) directory")


def _allow_unsupported_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--allow-unsupported",
        action="store_true",
        help="use a base that bases.toml does not mark supported (its tree is not hardened)",
    )


def _materialize_run(args: argparse.Namespace, config: Workspace) -> int:
    from vllm_fork.tree.materialize import materialize

    result = materialize(
        config,
        args.base,
        args.dir,
        keep_failed=args.keep_failed,
        allow_unsupported=args.allow_unsupported,
    )
    print(f"{result.path}: vLLM {result.version} + {result.applied} patch(es) on branch fork")
    return ExitCode.OK


# --- export ------------------------------------------------------------------------


def _export_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", type=Path, metavar="DIR", help="a work tree made by materialize")
    p.add_argument(
        "--force",
        action="store_true",
        help="export even from a detached or non-tip HEAD, or when patches would be dropped",
    )


def _export_run(args: argparse.Namespace, config: Workspace) -> int:
    from vllm_fork.tree.export import export

    result = export(config, args.dir, force=args.force)
    state = "changed" if result.changed else "unchanged"
    print(f"{result.series_dir}: {len(result.patches)} patch(es), {state}")
    for name in result.written:
        print(f"  wrote {name}")
    for name in result.removed:
        print(f"  removed {name}")
    for line in result.local:
        print(line)
    return ExitCode.OK


def _series_store_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--check",
        action="store_true",
        help="only say whether series/ is in the plain layout as written (exit 1 when "
        "a conversion would write)",
    )


def _series_store_run(args: argparse.Namespace, config: Workspace) -> int:
    from vllm_fork.lock import dir_lock
    from vllm_fork.series import legacy

    root = config.series_root
    with dir_lock(config.cache_dir, root):
        result = legacy.convert(root, check=args.check)
    for note in result.notes:
        print(f"  {note}")
    if args.check:
        stale = result.change.changed
        print(f"{root}: {result.bases} base(s), {'not ' if stale else ''}as written")
        for rel in result.change.written:
            print(f"  would write {rel}")
        for rel in result.change.removed:
            print(f"  would remove {rel}")
        return 1 if stale else 0
    before, after = result.before, result.after
    print(
        f"{root}: {result.bases} base(s); files {before['files']} -> {after['files']}, "
        f"distinct contents {before['distinct']} -> {after['distinct']}, "
        f"bytes {before['bytes']} -> {after['bytes']}, "
        f"lines {before['lines']} -> {after['lines']}"
        + ("" if result.change.changed else " (unchanged)")
    )
    return 1 if result.conflicts else 0


# --- status ------------------------------------------------------------------------


def _status_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--base", metavar="VERSION", help="pinned base (default: bases.toml default)")
    p.add_argument(
        "--fetch",
        action="store_true",
        help="also fetch the other releases the report reads (retirement search, --drift's "
        "known-issue probes) that are not in the cache; without it they are named as not covered",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument(
        "--tree",
        type=Path,
        metavar="DIR",
        help="probe a materialized work tree on disk (uncommitted edits included)",
    )
    p.add_argument(
        "--drift",
        action="store_true",
        help="the drift table instead: per logical patch (Fork-Patch), each base's copy "
        "against the newest (same, adapted, or absent and why); no probing",
    )


def _status_run(args: argparse.Namespace, config: Workspace) -> int:
    from vllm_fork.reports.drift import compute_drift, format_drift
    from vllm_fork.reports.status import compute_status, format_status

    if args.drift:
        if args.tree is not None or args.base is not None:
            raise UsageError("--drift covers every base; give it without --base or --tree")
        table = compute_drift(config, fetch=args.fetch)
        if args.json:
            print(json.dumps(table.to_json(), indent=2, sort_keys=True))
        else:
            print(format_drift(table))
        return 0
    report = compute_status(config, args.base, args.tree, fetch=args.fetch)
    if args.json:
        print(json.dumps(report.to_json(), indent=2, sort_keys=True))
    else:
        print(format_status(report))
    return ExitCode.OK


# --- test --------------------------------------------------------------------------


def _test_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", type=Path, metavar="DIR", help="a work tree made by materialize")
    p.add_argument(
        "--python",
        default=sys.executable,
        help="interpreter with torch and the tree's requirements (default: this one)",
    )
    p.add_argument(
        "--prove-fail",
        action="store_true",
        help="also run each change/hardening patch's tests without that patch: they must fail",
    )
    p.add_argument(
        "--pytest-args",
        default="",
        metavar="ARGS",
        help="extra pytest arguments, one string split as a shell would (e.g. '-x -k gate')",
    )


def _test_run(args: argparse.Namespace, config: Workspace) -> int:
    from vllm_fork.testing.forktests import check_tree, format_proofs

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    result = check_tree(
        args.dir, args.python, shlex.split(args.pytest_args), prove=args.prove_fail, log=progress
    )
    outcome = result.outcome
    print(f"fork tests on {args.dir.absolute()}: {outcome.summary()}")
    if result.proofs is not None:
        print(format_proofs(result.proofs))
        if not result.proven:
            print(
                "vllm-fork: error: some patch is not proven (its tests must pass with it "
                "and fail, not error or skip, without it)",
                file=sys.stderr,
            )
    # pytest-style closing line for whoever reads only the end of the log
    print(
        f"{outcome.passed} passed, {outcome.failed + outcome.errors} failed, "
        f"{outcome.skipped} skipped"
    )
    return ExitCode.OK if result.ok else ExitCode.FAILED


# --- change ------------------------------------------------------------------------


def _change_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=["add"], help="add: declare a change of your own")
    p.add_argument("id", metavar="ID", help="the change id patches name in Fork-Change")
    p.add_argument("--title", required=True, metavar="TEXT", help="what the change does")
    p.add_argument("--why", default="", metavar="TEXT", help="why the fork carries it")
    p.add_argument("--retire-when", default="", metavar="TEXT", help="when it is dropped")
    p.add_argument(
        "--files",
        action="append",
        default=[],
        metavar="PATH",
        help="a file of the vLLM tree the change lands in (repeatable; default: derived "
        "from its patches by export)",
    )
    p.add_argument(
        "--tests",
        action="append",
        default=[],
        metavar="PATH",
        help="a fork test module that proves it, tests/.../test_*.py (repeatable; "
        "default: derived from its patches by export)",
    )


def _change_run(args: argparse.Namespace, config: Workspace) -> int:
    from vllm_fork.facts import registry
    from vllm_fork.series.patches import local_change_trailers

    path = registry.declare_local_change(
        config.root, args.id, args.title, args.why, args.retire_when, args.files, args.tests
    )
    print(f"{path}: change {args.id} declared (a local change: no probe)")
    print(
        "next: `vllm-fork materialize DIR`, edit, add a test module (tests/.../test_*.py) "
        "that fails without the edit (a patch with no test is NOT PROVEN and fails "
        "prove-fail), and commit in DIR with the trailers\n"
        + "".join(f"  {key}: {value}\n" for key, value in local_change_trailers(args.id))
        + "then `vllm-fork export DIR` (it adds the patch's files and tests to the entry), "
        "`python -m vllm_fork.reports.tables --write`, `scripts/test.sh`, and commit "
        "local-changes.toml, series/, README.md and docs/changes.md (docs/changes.md)"
    )
    return ExitCode.OK


# --- gpu-bundle --------------------------------------------------------------------


def _gpu_bundle_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--base", metavar="VERSION", help="pinned base (default: bases.toml default)")
    p.add_argument(
        "-o", "--out", type=Path, required=True, metavar="DIR", help="new directory to write"
    )
    p.add_argument(
        "--tree",
        type=Path,
        metavar="DIR",
        help="an existing work tree of the base made by materialize (default: materialize one)",
    )
    p.add_argument(
        "--python-version",
        default="3.12",
        metavar="X.Y",
        help="Python of the GPU host, for the wheels (default: 3.12)",
    )


def _gpu_bundle_run(args: argparse.Namespace, config: Workspace) -> int:
    from vllm_fork.testing.gpubundle import bundle_base, bundle_size

    base = config.base(args.base)
    out = args.out.absolute()
    manifest = bundle_base(
        config, base.version, out, tree=args.tree, python_version=args.python_version
    )
    print(
        f"{out}: GPU test bundle of vLLM {manifest['base']} ({len(manifest['runs'])} runs, "
        f"{bundle_size(out) / 2**20:.1f} MiB); on the GPU host: sh {out.name}/run.sh RESULTS_DIR"
    )
    return ExitCode.OK


# --- cache -------------------------------------------------------------------------


def _cache_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "action",
        nargs="?",
        choices=["prune"],
        help="prune: remove what no pinned base or recent run needs (default: report)",
    )
    p.add_argument(
        "--dry-run", action="store_true", help="with prune: list what it would remove, remove none"
    )
    p.add_argument(
        "--unused-days",
        type=float,
        default=None,
        metavar="N",
        help="build environments, tree venvs, work trees, backport runs and watch clones "
        "unused for N days are prunable (default: 14)",
    )
    p.add_argument("--json", action="store_true", help="the report as JSON")


def _cache_run(args: argparse.Namespace, config: Workspace) -> int:
    from vllm_fork.sources import cachekeep

    days = cachekeep.UNUSED_DAYS if args.unused_days is None else args.unused_days
    if days < 0:
        raise UsageError("--unused-days must not be negative")
    if args.action is None:
        if args.dry_run:
            raise UsageError("--dry-run goes with `vllm-fork cache prune`")
        survey = cachekeep.survey(config, unused_days=days)
        if args.json:
            print(cachekeep.survey_json(survey))
        else:
            print(cachekeep.format_survey(survey))
            if survey.prunable:
                print(
                    "`vllm-fork cache prune` removes what the prunable column counts "
                    "(`--dry-run` lists it)"
                )
        return ExitCode.OK
    pruned = cachekeep.prune(config, unused_days=days, dry_run=args.dry_run)
    print(cachekeep.format_pruned(pruned))
    return ExitCode.OK


COMMANDS: dict[str, Command] = {
    "pin": Command(
        "record a release's sdist and wheel hashes in bases.toml (reads the index)",
        _pin_args,
        _pin_run,
    ),
    "fetch": Command(
        "download and verify a base (and import it into the cache)", _fetch_args, _fetch_run
    ),
    "materialize": Command(
        "make a git work tree: upstream commit + one commit per patch",
        _materialize_args,
        _materialize_run,
    ),
    "export": Command(
        "regenerate a base's series (series/<V>/series, series/pool/) from a work tree's commits",
        _export_args,
        _export_run,
    ),
    "series-store": Command(
        "convert series/ to plain patches stored once (older layouts, merges; idempotent)",
        _series_store_args,
        _series_store_run,
    ),
    "change": Command(
        "declare a change of your own in local-changes.toml (no Python needed)",
        _change_args,
        _change_run,
    ),
    "status": Command("per change: upstream, carried, n/a or missing", _status_args, _status_run),
    "known-issues": Command(
        "each known-issue entry's state on every base, from the cache (and its upstream_fix "
        "checked against the probes)",
        known_issues_args,
        known_issues_run,
    ),
    "watch": Command(
        "upstream vLLM's and AITER's changes to the fork's code after each base, to triage",
        watch_args,
        watch_run,
    ),
    "test": Command(
        "run the series' tests in a work tree (and prove they fail without their patch)",
        _test_args,
        _test_run,
    ),
    "cache": Command(
        "the download cache by kind with sizes; `cache prune` removes what no pinned base "
        "or recent run needs",
        _cache_args,
        _cache_run,
    ),
    "gpu-bundle": Command(
        "write what the GPU tests of a base need on an offline GPU host (tree subset, "
        "simulation, wheels, run script)",
        _gpu_bundle_args,
        _gpu_bundle_run,
    ),
    "rebase": Command(
        "replay a work tree's series onto a newer upstream release (3-way)", rebase_args, rebase_run
    ),
    "backport": Command(
        "carry one commit to every base that has its code (3-way), test, update every series",
        backport_args,
        backport_run,
    ),
    "matrix": Command(
        "per release: each change's state and whether the series applies", matrix_args, matrix_run
    ),
    "release-check": Command(
        "every base end to end: materialize, fork tests, prove-fail, wheel (resumable)",
        release_check_args,
        release_check_run,
    ),
    "release-merge": Command(
        "combine per-base release-check results (CI jobs, shards) into one report",
        release_merge_args,
        release_merge_run,
    ),
    "ci-workflows": Command(
        "generate the CI files (a job per base, merged report, update bot) from bases.toml",
        ci_workflows_args,
        ci_workflows_run,
    ),
    "update": Command(
        "pin releases newer than bases.toml, rebase the newest series onto them, test, report",
        update_args,
        update_run,
    ),
    "build": Command(
        "build the hardened wheel with vLLM's own build (precompiled, full or empty)",
        cli_build.build_args,
        cli_build.build_run,
    ),
    "verify": Command(
        "check a wheel's RECORD hashes and provenance against the series and pins",
        cli_build.verify_args,
        cli_build.verify_run,
    ),
    "audit": Command(
        "explain every member that differs from upstream's wheel by a patch or fork metadata",
        cli_build.audit_args,
        cli_build.audit_run,
    ),
    "smoke": Command(
        "install a wheel into a fresh venv and check it on CPU",
        cli_build.smoke_args,
        cli_build.smoke_run,
    ),
    "publish": Command(
        "verify wheels (with their SBOM and provenance) and upload them to an index",
        cli_deploy.publish_args,
        cli_deploy.publish_run,
    ),
    "release-notes": Command(
        "print a wheel's release notes (Markdown)",
        cli_deploy.notes_args,
        cli_deploy.notes_run,
    ),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vllm-fork",
        description="Keep the hardened vLLM fork as a patch series over pinned upstream releases.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument(
        "--offline", action="store_true", help="never use the network (also VLLM_FORK_OFFLINE=1)"
    )
    noise = parser.add_mutually_exclusive_group()
    noise.add_argument(
        "-v", "--verbose", action="store_true", help="debug messages; a traceback on failure"
    )
    noise.add_argument("-q", "--quiet", action="store_true", help="only warnings and errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, command in COMMANDS.items():
        p = sub.add_parser(name, help=command.help, description=command.help)
        p.add_argument(
            "--offline",
            action="store_true",
            default=argparse.SUPPRESS,
            help="never use the network (also VLLM_FORK_OFFLINE=1)",
        )
        command.add_arguments(p)
        p.set_defaults(_command=command)
    return parser


class Terminated(BaseException):
    """SIGTERM arrived: unwind so that temporary files are removed."""


def _on_term(signum: int, frame: object) -> None:
    raise Terminated


def _fs_message(exc: OSError) -> str:
    where = f" at {exc.filename}" if exc.filename else ""
    return (
        f"file-system error{where}: {exc.strerror or exc} (check that the path is a "
        f"writable directory with free space; the cache can be moved with {ENV_CACHE})"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    log.setup(1 if args.verbose else -1 if args.quiet else 0)
    previous = signal.getsignal(signal.SIGTERM)
    in_main = threading.current_thread() is threading.main_thread()
    if in_main:
        signal.signal(signal.SIGTERM, _on_term)
    try:
        return args._command.run(args, _workspace(args))
    except ForkError as exc:
        if args.verbose:
            traceback.print_exc()
        print(f"vllm-fork: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except Terminated:
        print("vllm-fork: terminated (SIGTERM); nothing partial was left", file=sys.stderr)
        return ExitCode.TERMINATED
    except OSError as exc:
        if isinstance(exc, BrokenPipeError):
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115
            return ExitCode.OK
        if args.verbose:
            traceback.print_exc()
        print(f"vllm-fork: error: {_fs_message(exc)}", file=sys.stderr)
        return ExitCode.FILE_SYSTEM
    except KeyboardInterrupt:
        print("vllm-fork: interrupted", file=sys.stderr)
        return ExitCode.INTERRUPTED
    except Exception as exc:
        if args.verbose:
            traceback.print_exc()
        print(
            f"vllm-fork: internal error: {type(exc).__name__}: {exc} "
            "(a bug: rerun with -v for the traceback and report it)",
            file=sys.stderr,
        )
        return ExitCode.INTERNAL
    finally:
        if in_main:
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
