"""`vllm-fork gpu-bundle`: what the fork's GPU tests need on an offline GPU
host that has a matching torch and no vLLM install.

The bundle (a directory, about 30 MB; its gzipped tar about 15 MB):

* ``tree/``: the materialized tree's Python package ``vllm/``, its rotary
  kernel sources (``csrc/pos_encoding_kernels.cu`` and the tree's headers it
  includes, on the torch::Tensor API or the stable libtorch ABI) and the
  test modules that run (upstream's rotary kernel tests,
  the series' own GPU kernel tests, with their helpers);
* ``without/<n>/``: for each patch a test guards, the files of the tree as
  they are without that patch (at its parent commit) where they differ;
* ``sim/``: the ROCm simulation; ``gpu/``: the fork's GPU tests, their
  pytest plugin and ``run_bundle.py``;
* ``wheels/``: the wheels of ``gpu/requirements.txt`` for the host's Python;
* ``run.sh`` and ``manifest.json``.

On the host: ``sh run.sh OUT`` makes a venv over the host's packages,
installs the wheels it lacks, builds the rotary kernels and writes JUnit XML
and a summary per run to OUT.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from vllm_fork.config import find_root
from vllm_fork.errors import ConfigError, ForkError, UsageError
from vllm_fork.git import run_git
from vllm_fork.sources.workspace import Workspace
from vllm_fork.testing.forktests import PatchCommit, patch_commits, sim_dir
from vllm_fork.tree.materialize import materialize

log = logging.getLogger(__name__)

GPU_DIR = "gpu"
KERNEL = "csrc/pos_encoding_kernels.cu"
LOCAL_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
# Upstream's tests of the rotary op and layer, run unchanged, and their helpers.
UPSTREAM_KERNEL_TESTS = (
    "tests/kernels/core/test_pos_encoding.py",
    "tests/kernels/core/test_rotary_embedding.py",
)
TEST_HELPERS = (
    "tests/__init__.py",
    "tests/kernels/__init__.py",
    "tests/kernels/core/__init__.py",
    "tests/kernels/allclose_default.py",
    "tests/kernels/utils.py",
    "tests/kernels/quant_utils.py",
    # helpers of the sparse-MLA GPU test (the tree's own reuse test)
    "tests/rocm/aiter/test_mla_sparse_metadata_reuse.py",
)
# The series' own kernel tests that need a GPU (they skip or fail on CPU).
FORK_KERNEL_TEST = re.compile(r"tests/kernels/core/test_rotary_embedding_[a-z_]+\.py")
SIM_TESTS = (
    "test_gpu_router_graph.py",
    "test_gpu_rope_bf16_compile.py",
    "test_gpu_mla_sparse_metadata_graph.py",
)
KERNEL_TESTS = ("test_gpu_rope_op_graph.py",)
PLATFORMS = (
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_26_x86_64",
    "manylinux_2_24_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
)
FORK_PATCHES = re.compile(r"^FORK_PATCHES = \((.*?)\)$", re.S | re.M)


class BundleError(ForkError):
    """The bundle could not be written."""


@dataclass(frozen=True)
class Run:
    name: str
    files: tuple[str, ...]
    sim: bool
    kernel: bool
    overlay: str | None = None
    of: str | None = None
    patch: str | None = None

    def to_json(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if v not in (None, ())} | {
            "files": list(self.files)
        }


def gpu_dir() -> Path:
    path = find_root() / GPU_DIR
    if not (path / "run_bundle.py").is_file():
        raise ConfigError(f"the fork repository has no GPU tests at {path}")
    return path


def guarded_patches(test: Path) -> tuple[str, ...]:
    """The subjects (or their beginnings) a fork GPU test module names in
    ``FORK_PATCHES``: the patches whose absence it must catch."""
    match = FORK_PATCHES.search(test.read_text())
    if not match:
        return ()
    return tuple(re.findall(r'"([^"]+)"', match.group(1)))


def _find_patch(commits: list[PatchCommit], subject: str) -> PatchCommit | None:
    for commit in commits:
        if subject in commit.subject:
            return commit
    return None


def _copy(src_root: Path, rel: str, dest_root: Path) -> bool:
    src = src_root / rel
    if not src.is_file():
        return False
    dest = dest_root / rel
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(src, dest)
    return True


def kernel_files(tree: Path) -> list[str]:
    """The rotary kernel's source and the tree's headers it includes,
    transitively (``#include "..."`` found next to the including file or
    under ``csrc/``), as paths relative to ``tree``; [] without a kernel."""
    if not (tree / KERNEL).is_file():
        return []
    found: list[str] = []
    todo = [KERNEL]
    while todo:
        rel = todo.pop()
        if rel in found:
            continue
        found.append(rel)
        text = (tree / rel).read_text(errors="replace")
        for name in LOCAL_INCLUDE.findall(text):
            for where in (Path(rel).parent / name, Path("csrc") / name):
                if (tree / where).is_file():
                    todo.append(where.as_posix())
                    break
    return sorted(found)


def kernel_abi(tree: Path) -> str | None:
    """``stable`` for a kernel written against the stable libtorch ABI
    (``torch::stable``, 0.22.0 on), ``torch`` for one on the torch::Tensor
    API, None without a kernel. The bundle builds either."""
    kernel = tree / KERNEL
    if not kernel.is_file():
        return None
    return "stable" if "torch::stable" in kernel.read_text() else "torch"


def _overlay(tree: Path, commit: PatchCommit, dest: Path, paths: set[str]) -> int:
    """Files of ``paths`` as they are at the patch's parent, where they differ
    from the tree's HEAD; a file absent there gets a ``.fork-absent`` marker."""
    changed = (
        run_git(["diff", "--name-only", f"{commit.sha}^", "HEAD", "--", "vllm", "csrc"], cwd=tree)
        .stdout.decode()
        .splitlines()
    )
    count = 0
    for rel in changed:
        if rel not in paths:
            continue
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        blob = subprocess.run(
            ["git", "show", f"{commit.sha}^:{rel}"], cwd=tree, capture_output=True
        )
        if blob.returncode != 0:
            target.with_name(target.name + ".fork-absent").write_bytes(b"")
        else:
            target.write_bytes(blob.stdout)
        count += 1
    return count


def download_wheels(requirements: Path, dest: Path, python_version: str) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--quiet",
        "--no-deps",
        "--only-binary=:all:",
        "--python-version",
        python_version,
        "--implementation",
        "cp",
        "-d",
        str(dest),
        "-r",
        str(requirements),
    ]
    for platform in PLATFORMS:
        cmd += ["--platform", platform]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.splitlines()[-8:])
        raise BundleError(f"pip download of {requirements} failed:\n{tail}")


def _tree_files(tree: Path) -> set[str]:
    files = {
        str(p.relative_to(tree))
        for p in (tree / "vllm").rglob("*")
        if p.is_file() and p.suffix in (".py", ".typed") and "__pycache__" not in p.parts
    }
    return files | set(kernel_files(tree))


def write_bundle(tree: Path, base: str, out: Path, python_version: str = "3.12") -> dict:
    """Write the bundle of the materialized work tree ``tree`` to ``out``."""
    if out.exists() and any(out.iterdir()):
        raise UsageError(f"{out} exists and is not empty; give a new directory")
    gpu = gpu_dir()
    commits = patch_commits(tree)
    if not commits:
        raise BundleError(f"{tree} has no series commits (is it a materialized work tree?)")
    head = run_git(["rev-parse", "--short", "HEAD"], cwd=tree).stdout.decode().strip()
    out.mkdir(parents=True, exist_ok=True)
    dest_tree = out / "tree"
    paths = _tree_files(tree)
    for rel in sorted(paths):
        _copy(tree, rel, dest_tree)
    # vLLM's CUDA platform detection reads its own version: the tree has no
    # install, so the runs on the CUDA platform get the metadata of one
    # (meta/ on their path; the ROCm simulation's runs go without it).
    info = out / "meta" / f"vllm-{base}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {base}\n")
    abi = kernel_abi(tree)
    kernel = abi is not None
    fork_kernel_tests = sorted(
        {f for c in commits for f in c.test_files if FORK_KERNEL_TEST.fullmatch(f)}
    )
    tests = [f for f in (*UPSTREAM_KERNEL_TESTS, *fork_kernel_tests) if (tree / f).is_file()]
    for rel in (*TEST_HELPERS, *tests):
        _copy(tree, rel, dest_tree)
    shutil.copytree(
        sim_dir() / "vllm_rocm_sim",
        out / "sim" / "vllm_rocm_sim",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    shutil.copytree(gpu, out / "gpu", ignore=shutil.ignore_patterns("__pycache__"))

    sim_tests = tuple(f"gpu/tests/{name}" for name in SIM_TESTS)
    kernel_tests = (*tuple(f"gpu/tests/{name}" for name in KERNEL_TESTS), *tests)
    runs = [Run("fork-sim", sim_tests, sim=True, kernel=False)]
    if kernel:
        runs.append(Run("fork-kernel", kernel_tests, sim=False, kernel=True))
    # Which patch each test guards: FORK_PATCHES of the fork's GPU tests, the
    # adding patch of the series' own kernel tests.
    guards: dict[str, list[str]] = {}
    for rel in (*sim_tests, *kernel_tests[: len(KERNEL_TESTS)]):
        for subject in guarded_patches(out / rel):
            guards.setdefault(subject, []).append(rel)
    for commit in commits:
        for rel in commit.test_files:
            if rel in fork_kernel_tests and commit.part in ("change", "hardening"):
                guards.setdefault(commit.subject, []).append(rel)
    missing: list[str] = []
    for n, (subject, files) in enumerate(sorted(guards.items()), 1):
        found = _find_patch(commits, subject)
        if found is None:
            missing.append(subject)
            continue
        commit = found
        overlay = f"without/{n:02d}"
        changed = _overlay(tree, commit, out / overlay, paths)
        sim_files = tuple(f for f in files if f in sim_tests)
        kernel_files = tuple(f for f in files if f not in sim_tests)
        if sim_files:
            runs.append(
                Run(
                    f"without-{n:02d}-sim",
                    sim_files,
                    True,
                    False,
                    overlay,
                    "fork-sim",
                    commit.subject,
                )
            )
        if kernel_files and kernel:
            runs.append(
                Run(
                    f"without-{n:02d}-kernel",
                    kernel_files,
                    False,
                    True,
                    overlay,
                    "fork-kernel",
                    commit.subject,
                )
            )
        log.info("without %r: %d file(s) differ", commit.subject, changed)
    download_wheels(gpu / "requirements.txt", out / "wheels", python_version)
    manifest = {
        "base": base,
        "series_head": head,
        "python": python_version,
        "kernel_built": kernel,
        "kernel_abi": abi,
        "not_in_series": missing,
        "runs": [r.to_json() for r in runs],
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    script = out / "run.sh"
    script.write_text(
        "#!/bin/sh\n"
        "# Run the fork's GPU tests of this bundle; results (JUnit XML, summary) in $1.\n"
        'here=$(cd "$(dirname "$0")" && pwd)\n'
        'exec "${PYTHON:-python3}" "$here/gpu/run_bundle.py" --out "${1:-$here/results}"\n'
    )
    script.chmod(0o755)
    return manifest


def bundle_size(out: Path) -> int:
    return sum(p.stat().st_size for p in out.rglob("*") if p.is_file())


def bundle_base(
    config: Workspace, version: str, out: Path, *, tree: Path | None, python_version: str
) -> dict:
    """:func:`write_bundle` of ``tree`` (a work tree of the base ``version``), else of
    a fresh materialize of the base in a temporary directory; the manifest."""
    if tree is not None:
        return write_bundle(tree.absolute(), version, out, python_version)
    with tempfile.TemporaryDirectory(prefix="vllm-fork-bundle-") as tmp:
        result = materialize(config, version, Path(tmp) / "tree")
        return write_bundle(result.path, version, out, python_version)
