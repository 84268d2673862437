"""`vllm-fork build`: the hardened wheel, built by vLLM's own build in a throwaway tree.

Steps: pick the base and its series; refuse a precompiled build of a series
that changes compiled sources; materialize base + series into a new
directory under the cache (the build writes ~1 GB into it and overwrites
vendored paths); write the provenance record into it; prepare the build
environment; call the tree's PEP 517 backend per the plan of
:mod:`vllm_fork.wheel.plan` through ``pyproject_hooks`` (the hook's return
value names the wheel); check the result with :mod:`vllm_fork.wheel.verify`;
move the wheel to the output directory.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pyproject_hooks
from packaging.utils import parse_wheel_filename

from vllm_fork import __version__, faults
from vllm_fork.atomic import place_file
from vllm_fork.errors import ForkError, UnsupportedBaseError, UsageError
from vllm_fork.git import git_out, run_git
from vllm_fork.hashing import sha256_file
from vllm_fork.lock import TMP_PREFIX, alive, clear_dead_owned, owned_tempdir, owned_tempfile
from vllm_fork.probes import DirTree, Finding, probe_all
from vllm_fork.probes.issues import built_issue_states
from vllm_fork.probes.rocm_pins import base_aiter
from vllm_fork.series.forkversion import fork_version, series_revision
from vllm_fork.series.patches import Series
from vllm_fork.series.precompiled import left_out_of, precompiled_conflicts, refusal_message
from vllm_fork.sources.pins import Base, FilePin, RocmPin, require_supported
from vllm_fork.sources.rocm import ensure_rocm_wheel
from vllm_fork.sources.workspace import Workspace
from vllm_fork.tree.materialize import materialize
from vllm_fork.wheel.audit import align_with_upstream_wheel
from vllm_fork.wheel.env import (
    BuildEnvError,
    build_environment,
    check_build_python,
    check_toolchain,
    compiler_missing,
    ensure_build_env,
    precompiled_rocm_requirements,
    probe_python,
    requirements_file,
)
from vllm_fork.wheel.options import check_sources
from vllm_fork.wheel.plan import BuildPlan, FullOptions, PlanError, plan_build, read_backend
from vllm_fork.wheel.provenance import PACKAGE_PATH, Provenance, make_record, write_into_tree
from vllm_fork.wheel.verify import verify_wheel

DOCKERFILE_HINT = (
    "For a container build on a ROCm build host: `vllm-fork materialize DIR`, then "
    "`docker build -f DIR/docker/Dockerfile.rocm DIR` (it builds the local tree); its wheel "
    "has neither the fork version nor the provenance record, so for a release run "
    "`vllm-fork build --mode full --device rocm` inside that image."
)
LOG_TAIL = 40


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
    rocm_variant: str | None = None  # which pinned ROCm wheel (--device rocm, precompiled)
    rocm_index: str | None = None  # where to download it (default: the index it was pinned from)
    allow_unsupported: bool = False  # build a base bases.toml does not mark supported


@dataclass(frozen=True)
class BuildResult:
    wheel: Path
    sha256: str
    version: str
    base: str
    series_digest: str
    mode: str
    device: str
    seconds: float
    build_seconds: float
    # What the release files beside the wheel say of it (deploy.release_files.release_files):
    # its provenance record, the build environment's versions, the probes' findings
    # and each known issue's state on the built tree (None: the pristine base is not
    # in the cache). Not printed by ``--json``.
    record: dict[str, Any] = field(default_factory=dict, compare=False)
    environment: dict[str, str | None] = field(default_factory=dict, compare=False)
    findings: dict[str, Finding] = field(default_factory=dict, compare=False)
    known_issues: dict[str, dict[str, Any]] | None = field(default=None, compare=False)

    def to_json(self) -> dict[str, Any]:
        """What ``vllm-fork build --json`` prints (one object)."""
        return {
            "wheel": str(self.wheel),
            "sha256": self.sha256,
            "version": self.version,
            "base": self.base,
            "series_digest": self.series_digest,
            "mode": self.mode,
            "device": self.device,
        }


log = logging.getLogger(__name__)


def upstream_platform(base: Base, rocm: RocmPin | None = None) -> str | None:
    """The manylinux platform tag of the pinned upstream wheel (e.g. manylinux_2_24_x86_64);
    ``rocm``: of that ROCm wheel instead."""
    name = rocm.filename if rocm is not None else base.wheel.filename if base.wheel else None
    if name is None:
        return None
    _, _, _, tags = parse_wheel_filename(name)
    plats = sorted({t.platform for t in tags if t.platform.startswith("manylinux")})
    return plats[0] if plats else None


@dataclass(frozen=True)
class Prepared:
    base: Base
    series: Series
    revision: int
    version: str
    plat_name: str | None
    left_out: tuple[str, ...] = ()  # patch files this build leaves out (Fork-Build: full)
    rocm: RocmPin | None = None  # the upstream ROCm wheel a precompiled rocm build reuses

    @property
    def upstream(self) -> FilePin | None:
        """The upstream wheel whose binaries a precompiled build reuses."""
        return self.rocm.file if self.rocm is not None else self.base.wheel


def prepare(config: Workspace, req: BuildRequest) -> Prepared:
    """Checks that need no download: base (supported), series (not empty), version,
    refusal rules, platform tag."""
    base = config.base(req.base)
    require_supported(config, base, allow=req.allow_unsupported)
    series = config.series(base.version)
    if not series.patches:
        # a wheel labelled +hardened would claim hardening that is not in it
        raise UnsupportedBaseError(
            f"series/{base.version} has no patches: there is nothing to build "
            f"(upstream's own vllm {base.version} wheel is the same code)"
        )
    revision = series_revision(series.directory, len(series.patches))
    left_out = tuple(h.file for h in left_out_of(series, req.mode))
    rocm = None
    if req.mode == "precompiled" and req.device == "rocm":
        rocm = base.rocm_pin(req.rocm_variant)  # says how to pin one when there is none
    elif req.rocm_variant:
        raise UsageError("--rocm-variant applies to a precompiled --device rocm build")
    version = fork_version(
        base.version, revision, left_out=bool(left_out), rocm=rocm.variant if rocm else None
    )
    if req.mode == "precompiled":
        conflicts = precompiled_conflicts(series.without(left_out).patches)
        if conflicts:
            raise BuildRefused(refusal_message(base.version, conflicts))
        if rocm is None and base.wheel is None:
            raise BuildRefused(
                f"bases.toml pins no upstream wheel for {base.version}: precompiled mode "
                "needs one (`vllm-fork pin`), or use --mode full on a build host"
            )
    if left_out:
        log.warning(
            f"a {req.mode} build leaves out the full-build-only patch(es) "
            + ", ".join(f"{h.file} ({h.change})" for h in left_out_of(series, req.mode))
            + f": the wheel is {version} and lacks them (--mode full includes them)"
        )
    plat = req.plat_name or upstream_platform(base, rocm)
    if req.mode != "empty" and plat is None:
        raise UsageError(f"no upstream wheel pinned for {base.version}: pass --plat-name")
    return Prepared(
        base, series, revision, version, plat if req.mode != "empty" else None, left_out, rocm
    )


def make_plan(
    config: Workspace,
    req: BuildRequest,
    prep: Prepared,
    *,
    tree: Path,
    out_dir: Path,
    python: str,
    epoch: int,
) -> BuildPlan:
    upstream_wheel = None
    if req.mode == "precompiled" and prep.upstream is not None:
        upstream_wheel = config.fetcher.cached_path(prep.upstream)
    try:
        # the backend is that of the tree's pyproject.toml; a dry run has no tree yet
        backend = read_backend(tree) if tree.is_dir() else None
        return plan_build(
            mode=req.mode,
            device=req.device,
            python=python,
            tree=tree,
            out_dir=out_dir,
            version=prep.version,
            source_date_epoch=epoch,
            backend=backend,
            plat_name=prep.plat_name,
            upstream_wheel=upstream_wheel,
            full=req.full if req.mode == "full" else None,
            offline=config.offline,
            rocm_version=prep.rocm.rocm if prep.rocm else None,
        )
    except PlanError as exc:
        raise UsageError(str(exc)) from None


def dry_run(config: Workspace, req: BuildRequest) -> str:
    """The environment and command a build would run (placeholders for what it creates)."""
    prep = prepare(config, req)
    tree = config.cache.work / "build-XXXXXX" / "src"
    python = req.build_python or str(config.cache.build_env_python("<key>"))
    plan = make_plan(
        config, req, prep, tree=tree, out_dir=tree.parent / "dist", python=python, epoch=0
    )
    env = dict(plan.set_env, SOURCE_DATE_EPOCH="<HEAD-commit-time>")
    plan = replace(plan, set_env=env)
    kept = len(prep.series.patches) - len(prep.left_out)
    text = [
        f"# vLLM {prep.base.version} + {kept} patch(es) -> "
        f"vllm-{prep.version} ({req.mode}, {req.device})",
        *(f"# left out (Fork-Build: full): {name}" for name in prep.left_out),
        *(
            [
                f"# binaries: {prep.rocm.filename} ({prep.rocm.variant}, ROCm {prep.rocm.rocm}); "
                f"the wheel is retagged {retag_of(prep.rocm)[0]}-{retag_of(prep.rocm)[1]} after "
                "the build, as upstream's ROCm wheel is"
            ]
            if prep.rocm
            else []
        ),
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


def _failure(log_path: Path, what: str) -> BuildFailed:
    lines = log_path.read_text(errors="replace").splitlines() if log_path.is_file() else []
    tail = "\n".join(lines[-LOG_TAIL:])
    return BuildFailed(f"{what}; last lines:\n{tail}\nfull log: {log_path}")


def _log_warnings(caught: list[warnings.WarningMessage], log_path: Path) -> None:
    with open(log_path, "a", encoding="utf-8") as fh:
        for w in caught:
            if issubclass(w.category, pyproject_hooks.BuildBackendWarning):
                fh.write(f"build backend warning: {w.message}\n")
                log.debug(f"build backend warning: {w.message}")
            else:
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)


def run_backend(plan: BuildPlan, log_path: Path) -> str:
    """Call the plan's ``build_wheel`` hook; the wheel's file name, as the hook returns it.

    The hook runs in a subprocess of the build Python (``pyproject_hooks``), in the
    plan's environment, its output going to ``log_path``.
    """
    backend = plan.backend or read_backend(plan.tree)
    environ = plan.environ(os.environ)

    def runner(
        cmd: Sequence[str], cwd: str | None = None, extra_environ: Mapping[str, str] | None = None
    ) -> None:
        env = dict(environ, **(extra_environ or {}))
        with open(log_path, "ab") as fh:
            proc = subprocess.run(list(cmd), cwd=cwd, env=env, stdout=fh, stderr=subprocess.STDOUT)
        if proc.returncode != 0:
            raise _failure(log_path, f"vLLM's build failed (exit {proc.returncode})")

    hooks = pyproject_hooks.BuildBackendHookCaller(
        str(plan.tree),
        backend.name,
        backend_path=list(backend.path) or None,
        runner=runner,
        python_executable=plan.python,
    )
    plan.out_dir.mkdir(parents=True, exist_ok=True)
    try:
        # the backend's warnings come back through the hook: into the log, not the terminal
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", pyproject_hooks.BuildBackendWarning)
            name = hooks.build_wheel(str(plan.out_dir), plan.config_settings)
        _log_warnings(caught, log_path)
    except (pyproject_hooks.BackendUnavailable, pyproject_hooks.HookMissing) as exc:
        raise _failure(
            log_path, f"the build backend {backend.name} cannot be used: {exc!r}"
        ) from None
    if not isinstance(name, str) or not name.endswith(".whl") or "/" in name:
        raise BuildFailed(f"{backend.name}'s build_wheel returned {name!r}, not a wheel name")
    return name


def retag_of(pin: RocmPin) -> tuple[str, str]:
    """The (python, abi) tags of upstream's ROCm wheel, which the fork wheel takes."""
    _, _, _, tags = parse_wheel_filename(pin.filename)
    tag = sorted(tags, key=str)[0]
    return tag.interpreter, tag.abi


def retag(built: Path, pin: RocmPin, *, python: str, epoch: int, log_path: Path) -> Path:
    """Give the wheel the Python and ABI tags of upstream's ROCm wheel (``cp312-cp312``).

    vLLM's build tags a wheel with the Python running it (``--py-limited-api`` gives
    ``cp38-abi3``), but the binaries it reuses are upstream's, built and published for
    one Python only: the fork wheel must not claim more. pypa's ``wheel tags`` rewrites
    the tags (file name, WHEEL and RECORD) in the build environment."""
    py_tag, abi_tag = retag_of(pin)
    env = dict(os.environ, SOURCE_DATE_EPOCH=str(epoch), PYTHONNOUSERSITE="1")
    env.pop("PYTHONPATH", None)
    cmd = [python, "-m", "wheel", "tags", f"--python-tag={py_tag}", f"--abi-tag={abi_tag}"]
    with open(log_path, "ab") as fh:
        proc = subprocess.run(
            [*cmd, "--remove", str(built)],
            cwd=built.parent,
            env=env,
            stdout=subprocess.PIPE,
            stderr=fh,
        )
    name = proc.stdout.decode().strip().splitlines()[-1:] if proc.returncode == 0 else []
    out = built.parent / name[0] if name else None
    if out is None or not out.is_file():
        raise _failure(log_path, f"retagging {built.name} as {py_tag}-{abi_tag} failed")
    log.info(f"retagged {built.name} -> {out.name} (the tags of {pin.filename})")
    return out


# The marked name of a build's scratch directory in <cache>/work (vllm_fork.lock).
BUILD_LABEL = "build-"


def _publish(built: Path, out_dir: Path) -> Path:
    """Move the verified wheel into ``out_dir`` atomically: a run killed meanwhile
    leaves no partial wheel there (only a marked ``.part`` file the next run of the
    tool in that directory may remove)."""
    target = out_dir / built.name
    for stale in out_dir.glob(f"{TMP_PREFIX}wheel.*.part"):
        pid = stale.name.removeprefix(f"{TMP_PREFIX}wheel.").split(".", 1)[0]
        if pid.isdigit() and not alive(int(pid)):  # left by a killed build
            stale.unlink(missing_ok=True)
    part = owned_tempfile(out_dir, f"wheel.{os.getpid()}")
    try:
        shutil.copyfile(built, part)
    except BaseException:  # SIGTERM or an I/O error: leave nothing behind
        part.unlink(missing_ok=True)
        raise
    # a wheel is a file to share, as the SBOM and provenance beside it
    place_file(part, target, shared=True, fault="build.publish")
    built.unlink()
    return target


# Runs the PEP 517 backend of a plan (its ``build_wheel`` hook), logging to the
# path given; returns the wheel's file name in ``plan.out_dir``. ``build`` takes it as
# a parameter (as pypa/build takes its runner): :func:`run_backend` by default.
BackendRunner = Callable[[BuildPlan, Path], str]


# --- the steps of a build, in order (each usable alone) -----------------------------


def check_buildable(req: BuildRequest, prep: Prepared) -> None:
    """What a full build can refuse before any work: missing sources, compiler or
    build Python (:func:`prepare` refused the rest, e.g. a base with no patches)."""
    if req.mode != "full":
        return
    missing = check_sources(req.full)
    if missing:
        raise UsageError("\n".join(missing))
    missing_compiler = compiler_missing(req.device)
    if missing_compiler:
        raise BuildEnvError(
            f"cannot run a full {req.device} build here: {missing_compiler}\n{DOCKERFILE_HINT}"
        )
    if req.build_python:
        _preflight(req, req.build_python, prep.base.torch)


@contextmanager
def scratch(config: Workspace, prep: Prepared, *, keep: bool) -> Iterator[Path]:
    """A build's own directory under ``<cache>/work`` (not ``<cache>/tmp``: the cache
    lock, taken by downloads of other runs meanwhile, empties tmp/ of what a killed
    run left); removed at the end unless ``keep`` or the build failed."""
    config.cache.work.mkdir(parents=True, exist_ok=True)
    clear_dead_owned(config.cache.work, BUILD_LABEL)  # trees of killed builds
    work = owned_tempdir(config.cache.work, f"{BUILD_LABEL}{prep.base.version}")
    try:
        yield work
    except BuildFailed:
        keep = True
        raise
    finally:
        if keep:
            log.info(f"kept the build tree {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def materialize_tree(config: Workspace, prep: Prepared, tree: Path) -> None:
    """The base and its series (less what this mode leaves out) as a git work tree."""
    log.info(
        f"materializing vLLM {prep.base.version} + "
        f"{len(prep.series.patches) - len(prep.left_out)} patch(es) into {tree}"
    )
    materialize(config, prep.base.version, tree, internal=True, exclude=prep.left_out)
    faults.point("build.materialized")


def reuse_upstream_binaries(
    config: Workspace, req: BuildRequest, prep: Prepared, tree: Path
) -> list[str]:
    """A precompiled build: fetch the upstream wheel whose binaries it reuses and align
    the tree's vendored files with it; the files aligned."""
    if req.mode != "precompiled":
        return []
    assert prep.upstream is not None
    if prep.rocm is not None:
        ensure_rocm_wheel(config, prep.rocm, req.rocm_index, config.fetcher)
    else:
        config.fetcher.ensure(prep.upstream)
    return align_with_upstream_wheel(
        config, tree, prep.base, left_out=prep.left_out, upstream=prep.upstream
    )


def write_provenance(
    config: Workspace, req: BuildRequest, prep: Prepared, tree: Path, aligned: list[str]
) -> tuple[Provenance, int]:
    """Write the provenance record into the tree (and git's index: setuptools-scm lists
    the package files from git); the record and the SOURCE_DATE_EPOCH (HEAD's time)."""
    record = make_record(
        base=prep.base,
        series=prep.series,
        version=prep.version,
        revision=prep.revision,
        mode=req.mode,
        device=req.device,
        tool_version=__version__,
        left_out=prep.left_out,
        rocm=prep.rocm,
        aiter=base_aiter(config, prep.base.version) if prep.rocm else None,
    )
    record = replace(record, from_upstream_wheel=tuple(aligned), offline=config.offline)
    write_into_tree(tree, record)
    run_git(["add", "-f", PACKAGE_PATH], cwd=tree)
    epoch = int(git_out(["log", "-1", "--format=%ct", "HEAD"], cwd=tree))
    return record, epoch


def build_python(
    config: Workspace, req: BuildRequest, prep: Prepared, tree: Path, work: Path
) -> str:
    """The Python that runs vLLM's build: the one given, else the build environment
    the tree's requirements make (cached by their content), checked for the mode."""
    if req.build_python:
        python = req.build_python
    elif prep.rocm is not None:
        # vLLM's setup.py only imports torch here: a small environment, not ROCm's torch
        reqs = precompiled_rocm_requirements(tree, work)
        python = str(ensure_build_env(config, reqs, allow_cpu_torch=True))
    else:
        python = str(ensure_build_env(config, requirements_file(tree, req.device)))
    if not (req.mode == "full" and req.build_python):  # checked by check_buildable
        _preflight(req, python, prep.base.torch)
    return python


def call_backend(plan: BuildPlan, runner: BackendRunner, log_path: Path) -> tuple[Path, float]:
    """Run vLLM's build (the plan's backend through ``runner``); the wheel and the
    seconds it took."""
    log.info(f"building vllm {plan.version} ({plan.mode}, {plan.device}); log: {log_path}")
    t0 = time.monotonic()
    faults.point("build.backend")
    plan.out_dir.mkdir(parents=True, exist_ok=True)
    name = runner(plan, log_path)
    built = plan.out_dir / name
    if not built.is_file():
        raise BuildFailed(f"vLLM's build returned {name!r} but no such wheel is in {plan.out_dir}")
    return built, time.monotonic() - t0


def verify_built(config: Workspace, built: Path, tree: Path, work: Path) -> None:
    """The one verification of the wheel (against its tree, the series and the pins)."""
    faults.point("build.verify")
    report = verify_wheel(config, built, tree=tree)
    if not report.passed:
        raise BuildFailed(
            "the built wheel does not verify:\n" + "\n".join(report.bad) + f"\nkept {work} "
            "for inspection"
        )


def build(
    config: Workspace, req: BuildRequest, *, runner: BackendRunner = run_backend
) -> BuildResult:
    """Build and verify the wheel of ``req`` into ``req.out_dir``.

    Only the build: the release files (SBOM, provenance statement, notes) are
    written after it by the caller (:func:`vllm_fork.deploy.release_files.release_files`), as
    are publishing and deploying.
    """
    start = time.monotonic()
    prep = prepare(config, req)
    check_buildable(req, prep)
    out_dir = req.out_dir.resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    with scratch(config, prep, keep=req.keep_tree) as work:
        tree, log_path = work / "src", work / "build.log"
        materialize_tree(config, prep, tree)
        aligned = reuse_upstream_binaries(config, req, prep, tree)
        record, epoch = write_provenance(config, req, prep, tree, aligned)
        python = build_python(config, req, prep, tree, work)
        plan = make_plan(
            config, req, prep, tree=tree, out_dir=work / "dist", python=python, epoch=epoch
        )
        built, build_seconds = call_backend(plan, runner, log_path)
        if prep.rocm is not None:
            built = retag(built, prep.rocm, python=python, epoch=epoch, log_path=log_path)
        verify_built(config, built, tree, work)
        environment = build_environment(python, tree)
        findings = probe_all(DirTree(tree))
        known_issues = built_issue_states(config, prep.base.version, DirTree(tree))
        wheel = _publish(built, out_dir)
    return BuildResult(
        wheel=wheel,
        sha256=sha256_file(wheel),
        version=prep.version,
        base=prep.base.version,
        series_digest=prep.series.digest(),
        mode=req.mode,
        device=req.device,
        seconds=time.monotonic() - start,
        build_seconds=build_seconds,
        record=record.to_json(),
        environment=environment,
        findings=findings,
        known_issues=known_issues,
    )
