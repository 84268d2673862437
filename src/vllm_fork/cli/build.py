"""Command-line entries of ``build``, ``verify`` and ``smoke`` (added to cli.COMMANDS)."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from vllm_fork.build.plan import DEVICES, MODES, FullOptions
from vllm_fork.config import Config

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
        help="GPU target of a full build (precompiled mode is cuda)",
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
        "made from the base's requirements/build/<device>.txt)",
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
        "--dry-run",
        action="store_true",
        help="print the build's environment and command, build nothing",
    )


def _full_options(args: argparse.Namespace) -> FullOptions:
    from vllm_fork.build.options import find_ccache, load_full_options, parse_source_option

    options, use_ccache = (
        load_full_options(args.build_config) if args.build_config else (FullOptions(), True)
    )
    sources = dict(options.sources)
    sources.update(parse_source_option(s) for s in args.source)
    changes: dict[str, object] = {"sources": sources}
    for attr in ("cuda_archs", "rocm_archs", "max_jobs", "nvcc_threads"):
        if getattr(args, attr) is not None:
            changes[attr] = getattr(args, attr)
    changes["ccache"] = find_ccache() if use_ccache and not args.no_ccache else None
    return replace(options, **changes)


def build_run(args: argparse.Namespace, config: Config) -> int:
    from vllm_fork.build.builder import BuildRequest, build, dry_run
    from vllm_fork.errors import UnsupportedBaseError
    from vllm_fork.series.patches import load_series
    from vllm_fork.sources.pins import load_pins, require_supported

    base = load_pins(config.bases_file).get(args.base)
    require_supported(config, base, allow=args.allow_unsupported)
    if not load_series(config.series_dir(base.version)).patches:
        # A wheel labelled +hardened would claim hardening that is not in it.
        raise UnsupportedBaseError(
            f"series/{base.version} has no patches: there is nothing to build "
            f"(upstream's own vllm {base.version} wheel is the same code)"
        )

    req = BuildRequest(
        base=args.base,
        mode=args.mode,
        device=args.device,
        out_dir=args.output,
        build_python=args.build_python,
        plat_name=args.plat_name,
        full=_full_options(args),
        keep_tree=args.keep_tree,
    )
    if args.dry_run:
        print(dry_run(config, req))
        return 0
    result = build(config, req)
    size = result.wheel.stat().st_size / 2**20
    print(f"{result.wheel} ({size:.0f} MiB)")
    print(
        f"vllm {result.version}: built in {result.seconds:.0f} s "
        f"(vLLM's build step {result.build_seconds:.0f} s)"
    )
    return 0


# --- verify ------------------------------------------------------------------------


def verify_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("wheel", type=Path, metavar="WHEEL")


def verify_run(args: argparse.Namespace, config: Config) -> int:
    from vllm_fork.build.verify import verify_wheel

    report = verify_wheel(config, args.wheel)
    print(report.format())
    return 0 if report.passed else 1


# --- smoke -------------------------------------------------------------------------


def smoke_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("wheel", type=Path, metavar="WHEEL")
    p.add_argument(
        "--venv",
        type=Path,
        metavar="DIR",
        help="create the venv here and keep it (default: a temporary one)",
    )


def smoke_run(args: argparse.Namespace, config: Config) -> int:
    from vllm_fork.build.smoke import format_result, smoke

    result = smoke(config, args.wheel, venv=args.venv)
    print(format_result(args.wheel, result))
    return 0 if not result.failures else 1
