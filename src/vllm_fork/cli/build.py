"""Command-line entries of ``build``, ``verify`` and ``smoke`` (added to cli.COMMANDS)."""

from __future__ import annotations

import argparse
import json
import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

from vllm_fork.errors import ExitCode, UsageError
from vllm_fork.sources.workspace import Workspace
from vllm_fork.wheel.plan import DEVICES, MODES, FullOptions

log = logging.getLogger(__name__)

# --- build -------------------------------------------------------------------------


def build_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--base", metavar="VERSION", help="pinned base (default: bases.toml default)")
    p.add_argument(
        "--allow-unsupported",
        action="store_true",
        help="build a base that bases.toml does not mark supported",
    )
    p.add_argument(
        "--mode",
        choices=MODES,
        default="precompiled",
        help="precompiled: upstream's binaries + our Python (default; refused when "
        "the series changes compiled sources); full: compile the extensions "
        "(build host); empty: pure Python",
    )
    p.add_argument(
        "--device",
        choices=DEVICES,
        default="cuda",
        help="GPU target (default cuda); a precompiled rocm build reuses the ROCm wheel "
        "bases.toml pins for the base (`vllm-fork pin V --rocm-index URL`)",
    )
    p.add_argument(
        "--rocm-variant",
        metavar="rocmNNN",
        help="which pinned ROCm wheel a precompiled rocm build reuses (needed when several)",
    )
    p.add_argument(
        "--rocm-index",
        metavar="URL|DIR",
        help="where to download the pinned ROCm wheel (default: the index it was pinned "
        "from, or the download cache)",
    )
    p.add_argument(
        "-o",
        "--output",
        type=Path,
        default=Path("dist"),
        metavar="DIST",
        help="directory for the wheel (default: ./dist)",
    )
    p.add_argument(
        "--build-python",
        metavar="PYTHON",
        help="use this interpreter's packages to build (default: a cached venv "
        "made from the base's build requirements, requirements/build/<device>.txt)",
    )
    p.add_argument(
        "--plat-name",
        metavar="TAG",
        help="platform tag (default: that of the pinned upstream wheel)",
    )
    p.add_argument(
        "--build-config",
        type=Path,
        metavar="TOML",
        help="full-build settings ([full] table: archs, jobs, sources)",
    )
    p.add_argument("--cuda-archs", metavar="LIST", help="TORCH_CUDA_ARCH_LIST of a full build")
    p.add_argument("--rocm-archs", metavar="LIST", help="PYTORCH_ROCM_ARCH of a full build")
    p.add_argument("--max-jobs", type=int, metavar="N", help="MAX_JOBS of a full build")
    p.add_argument("--nvcc-threads", type=int, metavar="N", help="NVCC_THREADS (cuda)")
    p.add_argument(
        "--source",
        action="append",
        default=[],
        metavar="NAME=DIR",
        help="offline source of a dependency CMake would fetch (repeatable): "
        "cutlass, flash-attn, flashmla, deepgemm, qutlass, triton-kernels",
    )
    p.add_argument("--no-ccache", action="store_true", help="do not use ccache in a full build")
    p.add_argument("--keep-tree", action="store_true", help="keep the throwaway build tree")
    p.add_argument(
        "--signing-key",
        type=Path,
        metavar="PEM",
        help="Ed25519 private key signing the provenance statement (also VLLM_FORK_SIGNING_KEY)",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="print the build's environment and command, build nothing",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object (wheel, sha256, version, base, series_digest, mode, "
        "device) instead of the summary lines; with --dry-run, the plan as JSON",
    )


def _full_options(args: argparse.Namespace) -> FullOptions:
    from vllm_fork.wheel.options import find_ccache, load_full_options, parse_source_option

    options, use_ccache = (
        load_full_options(args.build_config) if args.build_config else (FullOptions(), True)
    )
    sources = dict(options.sources)
    sources.update(parse_source_option(s) for s in args.source)
    changes: dict[str, Any] = {"sources": sources}
    for attr in ("cuda_archs", "rocm_archs", "max_jobs", "nvcc_threads"):
        if getattr(args, attr) is not None:
            changes[attr] = getattr(args, attr)
    changes["ccache"] = find_ccache() if use_ccache and not args.no_ccache else None
    return replace(options, **changes)


def build_run(args: argparse.Namespace, config: Workspace) -> int:
    from vllm_fork.deploy.attestation import load_private_key
    from vllm_fork.deploy.release_files import release_files
    from vllm_fork.wheel.builder import BuildRequest, build, dry_run

    req = BuildRequest(
        base=args.base,
        mode=args.mode,
        device=args.device,
        out_dir=args.output,
        build_python=args.build_python,
        plat_name=args.plat_name,
        full=_full_options(args),
        keep_tree=args.keep_tree,
        rocm_variant=args.rocm_variant,
        rocm_index=args.rocm_index,
        allow_unsupported=args.allow_unsupported,
    )
    if args.dry_run:
        text = dry_run(config, req)
        print(json.dumps({"dry_run": text}, indent=2) if args.json else text)
        return ExitCode.OK
    if args.signing_key is not None:  # a bad key fails now, not after the build
        load_private_key(args.signing_key)
    result = build(config, req)
    release_files(config, result, signing_key=args.signing_key)
    if args.json:
        log.info(
            f"vllm {result.version}: built in {result.seconds:.0f} s "
            f"(vLLM's build step {result.build_seconds:.0f} s)"
        )
        print(json.dumps(result.to_json(), indent=2, sort_keys=True))
        return ExitCode.OK
    size = result.wheel.stat().st_size / 2**20
    print(f"{result.wheel} ({size:.0f} MiB)")
    print(
        f"vllm {result.version}: built in {result.seconds:.0f} s "
        f"(vLLM's build step {result.build_seconds:.0f} s)"
    )
    return ExitCode.OK


# --- verify ------------------------------------------------------------------------


def verify_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("wheel", type=Path, metavar="WHEEL")
    p.add_argument(
        "--public-key",
        type=Path,
        metavar="PEM",
        help="Ed25519 public key checking a signed provenance statement "
        "(also VLLM_FORK_PUBLIC_KEY)",
    )
    p.add_argument(
        "--require-release-files",
        action="store_true",
        help="fail when the SBOM or provenance statement is not beside the wheel",
    )


def verify_run(args: argparse.Namespace, config: Workspace) -> int:
    from vllm_fork.deploy.release_files import verify_release

    report = verify_release(
        config,
        args.wheel,
        public_key=args.public_key,
        require_release_files=args.require_release_files,
    )
    print(report.format())
    return ExitCode.OK if report.passed else ExitCode.FAILED


# --- audit -------------------------------------------------------------------------


def audit_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("wheel", type=Path, metavar="WHEEL")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def audit_run(args: argparse.Namespace, config: Workspace) -> int:
    from vllm_fork.wheel.audit import audit_wheel

    report = audit_wheel(config, args.wheel)
    if args.json:
        print(json.dumps(report.to_json(), indent=2, sort_keys=True))
    else:
        print(report.format())
    return ExitCode.OK if report.passed else ExitCode.FAILED


# --- smoke -------------------------------------------------------------------------


def smoke_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "wheel",
        type=Path,
        nargs="?",
        metavar="WHEEL",
        help="the wheel (optional with --installed: the installed record is then the reference)",
    )
    p.add_argument(
        "--venv",
        type=Path,
        metavar="DIR",
        help="create the venv here and keep it (default: a temporary one)",
    )
    p.add_argument(
        "--installed",
        type=Path,
        metavar="VENV",
        help="check WHEEL as installed in this existing venv (e.g. by pip from an index)",
    )
    p.add_argument(
        "--no-import",
        action="store_true",
        help="with --installed: check the installed files only, not `import vllm` "
        "(a --no-deps install)",
    )


def smoke_run(args: argparse.Namespace, config: Workspace) -> int:
    from vllm_fork.wheel.smoke import format_result, smoke

    if args.wheel is None and args.installed is None:
        raise UsageError("give the WHEEL to install, or --installed VENV to check")
    if args.no_import and args.installed is None:
        raise UsageError("--no-import goes with --installed VENV")
    result = smoke(
        config,
        args.wheel,
        venv=args.venv,
        installed=args.installed,
        import_vllm=not args.no_import,
    )
    print(format_result(args.wheel, result))
    return ExitCode.OK if not result.failures else ExitCode.FAILED
