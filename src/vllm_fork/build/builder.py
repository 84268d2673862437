"""`vllm-fork build`: the hardened wheel, built by vLLM's own build in a throwaway tree.

Steps: pick the base and its series; refuse a precompiled build of a series
that changes compiled sources; materialize base + series into a new
directory under the cache (the build writes ~1 GB into it and overwrites
vendored paths); write the provenance record into it; prepare the build
environment; run the plan of :mod:`vllm_fork.build.plan`; check the result
with :mod:`vllm_fork.verify`; move the wheel to the output directory.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from packaging.utils import parse_wheel_filename

from vllm_fork import __version__
from vllm_fork.build.env import (
    BuildEnvError,
    check_build_python,
    check_toolchain,
    compiler_missing,
    ensure_build_env,
    probe_python,
    requirements_file,
)
from vllm_fork.build.options import check_sources
from vllm_fork.build.plan import BuildPlan, FullOptions, PlanError, plan_build
from vllm_fork.build.rules import precompiled_conflicts, refusal_message
from vllm_fork.build.verify import verify_wheel
from vllm_fork.config import Config
from vllm_fork.errors import ForkError, UsageError
from vllm_fork.git import git_out, run_git
from vllm_fork.provenance import PACKAGE_PATH, make_record, write_into_tree
from vllm_fork.series.forkversion import fork_version, series_revision
from vllm_fork.series.patches import Series, load_series
from vllm_fork.sources.fetch import Fetcher
from vllm_fork.sources.pins import Base, load_pins

DOCKERFILE_HINT = (
    "For a container build on a ROCm build host: `vllm-fork materialize DIR`, then "
    "`docker build -f DIR/docker/Dockerfile.rocm DIR` (it builds the local tree); its wheel "
    "has neither the fork version nor the provenance record, so for a release run "
    "`vllm-fork build --mode full --device rocm` inside that image."
)
LOG_TAIL = 40


def work_root(config: Config) -> Path:
    """Where build trees and smoke venvs live while in use: ``<cache>/work``.

    Not ``<cache>/tmp``, which the cache lock empties of what a killed run left.
    """
    from vllm_fork.tree.materialize import WORK_DIR

    return config.cache_dir / WORK_DIR


class BuildRefused(ForkError):
    """The series cannot be built in the mode asked."""


class BuildFailed(ForkError):
    """vLLM's build ran and failed."""


@dataclass(frozen=True)
class BuildRequest:
    base: str | None = None
    mode: str = "precompiled"
    device: str = "cuda"
    out_dir: Path = Path("dist")
    build_python: str | None = None
    plat_name: str | None = None
    full: FullOptions = field(default_factory=FullOptions)
    keep_tree: bool = False


@dataclass(frozen=True)
class BuildResult:
    wheel: Path
    version: str
    seconds: float
    build_seconds: float


log = logging.getLogger(__name__)


def upstream_platform(base: Base) -> str | None:
    """The manylinux platform tag of the pinned upstream wheel (e.g. manylinux_2_24_x86_64)."""
    if base.wheel is None:
        return None
    _, _, _, tags = parse_wheel_filename(base.wheel.filename)
    plats = sorted({t.platform for t in tags if t.platform.startswith("manylinux")})
    return plats[0] if plats else None


@dataclass(frozen=True)
class Prepared:
    base: Base
    series: Series
    revision: int
    version: str
    plat_name: str | None


def prepare(config: Config, req: BuildRequest) -> Prepared:
    """Checks that need no download: base, series, version, refusal rules, platform tag."""
    base = load_pins(config.bases_file).get(req.base)
    series = load_series(config.series_dir(base.version))
    revision = series_revision(series.directory, len(series.patches))
    version = fork_version(base.version, revision)
    if req.mode == "precompiled":
        if req.device != "cuda":
            raise UsageError(
                "precompiled mode reuses upstream's CUDA wheel: use --device cuda, or "
                "--mode full --device rocm on a build host"
            )
        conflicts = precompiled_conflicts(series.patches)
        if conflicts:
            raise BuildRefused(refusal_message(base.version, conflicts))
        if base.wheel is None:
            raise BuildRefused(
                f"bases.toml pins no upstream wheel for {base.version}: precompiled mode "
                "needs one (`vllm-fork pin`), or use --mode full on a build host"
            )
    plat = req.plat_name or upstream_platform(base)
    if req.mode != "empty" and plat is None:
        raise UsageError(f"no upstream wheel pinned for {base.version}: pass --plat-name")
    return Prepared(base, series, revision, version, plat if req.mode != "empty" else None)


def make_plan(
    config: Config,
    req: BuildRequest,
    prep: Prepared,
    *,
    tree: Path,
    out_dir: Path,
    python: str,
    epoch: int,
) -> BuildPlan:
    upstream_wheel = None
    if req.mode == "precompiled" and prep.base.wheel is not None:
        upstream_wheel = Fetcher(config).cached_path(prep.base.wheel)
    try:
        return plan_build(
            mode=req.mode,
            device=req.device,
            python=python,
            tree=tree,
            out_dir=out_dir,
            version=prep.version,
            source_date_epoch=epoch,
            plat_name=prep.plat_name,
            upstream_wheel=upstream_wheel,
            full=req.full if req.mode == "full" else None,
        )
    except PlanError as exc:
        raise UsageError(str(exc)) from None


def dry_run(config: Config, req: BuildRequest) -> str:
    """The environment and command a build would run (placeholders for what it creates)."""
    prep = prepare(config, req)
    tree = work_root(config) / "build-XXXXXX" / "src"
    python = req.build_python or str(config.cache_dir / "build-env" / "<key>" / "bin" / "python")
    plan = make_plan(
        config, req, prep, tree=tree, out_dir=tree.parent / "dist", python=python, epoch=0
    )
    env = dict(plan.set_env, SOURCE_DATE_EPOCH="<HEAD-commit-time>")
    plan = replace(plan, set_env=env)
    text = [
        f"# vLLM {prep.base.version} + {len(prep.series.patches)} patch(es) -> "
        f"vllm-{prep.version} ({req.mode}, {req.device})",
        "# the tree is a fresh `materialize` of the base and its series; SOURCE_DATE_EPOCH "
        "is set to its HEAD commit time",
        plan.render(os.environ),
    ]
    if req.mode == "full":
        text.append(f"# {DOCKERFILE_HINT}")
    return "\n".join(text)


def _preflight(req: BuildRequest, python: str, pinned_torch: str | None) -> None:
    info = probe_python(python)
    problems = check_build_python(info, req.mode, req.device, pinned_torch)
    if req.mode == "full":
        problems += check_toolchain(req.device, info)
    if problems:
        hint = f"\n{DOCKERFILE_HINT}" if req.mode == "full" else ""
        raise BuildEnvError(
            f"the build Python {python} cannot run a {req.mode} {req.device} build:\n  "
            + "\n  ".join(problems)
            + hint
        )


def _run_logged(plan: BuildPlan, log: Path) -> str:
    with open(log, "wb") as fh:
        proc = subprocess.run(
            list(plan.command),
            cwd=plan.tree,
            env=plan.environ(os.environ),
            stdout=fh,
            stderr=subprocess.STDOUT,
        )
    lines = log.read_text(errors="replace").splitlines()
    if proc.returncode != 0:
        tail = "\n".join(lines[-LOG_TAIL:])
        raise BuildFailed(
            f"vLLM's build failed (exit {proc.returncode}); last lines:\n{tail}\nfull log: {log}"
        )
    return lines[-1].strip() if lines else ""


def build(config: Config, req: BuildRequest) -> BuildResult:
    start = time.monotonic()
    prep = prepare(config, req)
    if req.mode == "full":
        missing = check_sources(req.full)
        if missing:
            raise UsageError("\n".join(missing))
        # the compiler (and a given build Python) can be checked before any work
        missing_compiler = compiler_missing(req.device)
        if missing_compiler:
            raise BuildEnvError(
                f"cannot run a full {req.device} build here: {missing_compiler}\n{DOCKERFILE_HINT}"
            )
        if req.build_python:
            _preflight(req, req.build_python, prep.base.torch)
    out_dir = req.out_dir.resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    work_root(config).mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f"build-{prep.base.version}-", dir=work_root(config)))
    keep = req.keep_tree
    try:
        from vllm_fork.tree.materialize import materialize

        tree = work / "src"
        log.info(
            f"materializing vLLM {prep.base.version} + {len(prep.series.patches)} patch(es) "
            f"into {tree}"
        )
        materialize(config, prep.base.version, tree, internal=True)
        record = make_record(
            base=prep.base,
            series=prep.series,
            version=prep.version,
            revision=prep.revision,
            mode=req.mode,
            device=req.device,
            tool_version=__version__,
        )
        write_into_tree(tree, record)
        # setuptools-scm lists the package files from git: the record must be in the index.
        run_git(["add", "-f", PACKAGE_PATH], cwd=tree)
        epoch = int(git_out(["log", "-1", "--format=%ct", "HEAD"], cwd=tree))
        if req.mode == "precompiled":
            assert prep.base.wheel is not None
            Fetcher(config).ensure(prep.base.wheel)
        python = req.build_python or str(
            ensure_build_env(config, requirements_file(tree, req.device))
        )
        if not (req.mode == "full" and req.build_python):
            _preflight(req, python, prep.base.torch)
        dist = work / "dist"
        plan = make_plan(config, req, prep, tree=tree, out_dir=dist, python=python, epoch=epoch)
        log.info(
            f"building vllm {prep.version} ({req.mode}, {req.device}); log: {work / 'build.log'}"
        )
        t0 = time.monotonic()
        name = _run_logged(plan, work / "build.log")
        build_seconds = time.monotonic() - t0
        built = dist / name
        if not built.is_file():
            raise BuildFailed(f"vLLM's build reported {name!r} but no such wheel is in {dist}")
        report = verify_wheel(config, built)
        if not report.passed:
            keep = True
            raise BuildFailed(
                "the built wheel does not verify:\n"
                + "\n".join(report.bad)
                + f"\nkept {work} for inspection"
            )
        target = out_dir / built.name
        shutil.move(built, target)
        return BuildResult(target, prep.version, time.monotonic() - start, build_seconds)
    except BuildFailed:
        keep = True
        raise
    finally:
        if keep:
            log.info(f"kept the build tree {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
