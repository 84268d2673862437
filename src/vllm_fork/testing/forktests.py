"""`vllm-fork test`: run the fork's own tests inside a materialized tree, and
prove that they can fail.

The tests of a patch are the ``tests/**/test_*.py`` modules the patch adds or
modifies. ``run_fork_tests`` runs all of them on the work tree as it is.
``prove_failing`` checks, for every ``change`` and ``hardening`` patch, that
its tests fail on the tree without that patch: a detached worktree at the
patch's parent commit receives the patch's test modules (and nothing else of
the patch) and pytest must report at least one failure or error there.
``tests`` patches pin behaviour the base already has, so they are expected
to pass on their parent and are reported, not judged; ``support`` patches
carry test infrastructure and are skipped.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from vllm_fork.changes.state import JUDGED_PARTS, PART_TESTS
from vllm_fork.errors import ForkError, WorkTreeError
from vllm_fork.git import run_git
from vllm_fork.tree.commits import series_commits

SIM_PLUGIN = "tests/rocm/sim/plugin.py"


@dataclass(frozen=True)
class PatchCommit:
    sha: str
    subject: str
    change: str
    part: str
    test_files: tuple[str, ...]


@dataclass(frozen=True)
class PytestOutcome:
    returncode: int
    tests: int
    failed: int
    errors: int
    skipped: int

    @property
    def passed(self) -> int:
        return self.tests - self.failed - self.errors - self.skipped

    @property
    def green(self) -> bool:
        return self.returncode == 0 and self.failed == 0 and self.errors == 0 and self.passed > 0

    @property
    def red(self) -> bool:
        return self.failed + self.errors > 0

    def summary(self) -> str:
        return (
            f"{self.passed} passed, {self.failed} failed, {self.errors} errors, "
            f"{self.skipped} skipped"
        )


@dataclass(frozen=True)
class FailProof:
    patch: PatchCommit
    without: PytestOutcome | None  # None: not judged (tests/support part)

    @property
    def verdict(self) -> str:
        if self.without is None:
            return "pins upstream behaviour" if self.patch.part == PART_TESTS else "not judged"
        if self.without.red:
            return "fails without the patch"
        if self.without.passed == 0:
            return "NOT PROVEN: every test skipped here"
        return "NOT PROVEN: passes without the patch"

    @property
    def ok(self) -> bool:
        return self.without is None or self.without.red or self.without.passed == 0


def sim_plugin_args(tree: Path) -> list[str]:
    """Load the fork's ROCm simulation as a pytest plugin when the tree has it.

    The simulation must be active before vLLM resolves its platform, which
    the tree's root conftest does, so it cannot be a conftest itself.
    """
    if (tree / SIM_PLUGIN).is_file():
        return ["-p", SIM_PLUGIN.removesuffix(".py").replace("/", ".")]
    return []


def is_test_module(path: str) -> bool:
    name = path.rsplit("/", 1)[-1]
    return path.startswith("tests/") and name.startswith("test_") and name.endswith(".py")


def patch_commits(tree: Path) -> list[PatchCommit]:
    """The series commits of a materialized work tree, oldest first."""
    return [
        PatchCommit(
            sha=c.sha,
            subject=c.subject or c.sha,
            change=c.change,
            part=c.part,
            test_files=tuple(f for f in c.paths("A", "M") if is_test_module(f)),
        )
        for c in series_commits(tree)
    ]


def _count(suites: list[ET.Element], key: str) -> int:
    return sum(int(s.get(key, "0")) for s in suites)


def parse_junit(path: Path, returncode: int) -> PytestOutcome:
    """Counts from pytest's JUnit XML report."""
    if not path.exists():
        # pytest died before writing its report (e.g. an import error in a plugin)
        return PytestOutcome(returncode, tests=1, failed=0, errors=1, skipped=0)
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    return PytestOutcome(
        returncode,
        tests=_count(suites, "tests"),
        failed=_count(suites, "failures"),
        errors=_count(suites, "errors"),
        skipped=_count(suites, "skipped"),
    )


def run_pytest(
    tree: Path,
    python: str,
    files: Sequence[str],
    *,
    extra_args: Sequence[str] = (),
    timeout: float = 1800,
    quiet: bool = False,
) -> PytestOutcome:
    """Run pytest on ``files`` from the root of ``tree`` with ``python``."""
    with tempfile.TemporaryDirectory(prefix="vllm-fork-junit-") as tmp:
        junit = Path(tmp) / "junit.xml"
        cmd = [
            python,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            f"--junitxml={junit}",
            *extra_args,
            *files,
        ]
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tree), env.get("PYTHONPATH")]))
        try:
            proc = subprocess.run(
                cmd,
                cwd=tree,
                env=env,
                timeout=timeout,
                stdout=subprocess.DEVNULL if quiet else None,
                stderr=subprocess.STDOUT if quiet else None,
            )
        except FileNotFoundError as exc:
            raise ForkError(f"cannot run {python}: {exc}") from exc
        except subprocess.TimeoutExpired as exc:
            raise ForkError(f"pytest in {tree} took longer than {timeout:.0f} s") from exc
        return parse_junit(junit, proc.returncode)


def all_test_files(commits: Sequence[PatchCommit], tree: Path) -> list[str]:
    """Every test module the series touches that still exists, in series order."""
    seen: dict[str, None] = {}
    for commit in commits:
        for path in commit.test_files:
            if (tree / path).is_file():
                seen.setdefault(path, None)
    return list(seen)


def run_fork_tests(tree: Path, python: str, extra_args: Sequence[str] = ()) -> PytestOutcome:
    commits = patch_commits(tree)
    files = all_test_files(commits, tree)
    if not files:
        raise WorkTreeError(f"the series of {tree} adds no test modules")
    return run_pytest(tree, python, files, extra_args=extra_args)


def prove_failing(
    tree: Path, python: str, extra_args: Sequence[str] = (), quiet: bool = True
) -> list[FailProof]:
    """Run each judged patch's tests on the tree without that patch."""
    proofs = []
    for commit in patch_commits(tree):
        if not commit.test_files:
            continue
        if commit.part not in JUDGED_PARTS:
            proofs.append(FailProof(commit, None))
            continue
        scratch = Path(tempfile.mkdtemp(prefix="vllm-fork-without-"))
        worktree = scratch / "tree"
        try:
            run_git(["worktree", "add", "-q", "--detach", worktree, f"{commit.sha}^"], cwd=tree)
            run_git(["checkout", commit.sha, "--", *commit.test_files], cwd=worktree)
            outcome = run_pytest(
                worktree, python, commit.test_files, extra_args=extra_args, quiet=quiet
            )
            proofs.append(FailProof(commit, outcome))
        finally:
            run_git(["worktree", "remove", "--force", worktree], cwd=tree, check=False)
            run_git(["worktree", "prune"], cwd=tree, check=False)
            shutil.rmtree(scratch, ignore_errors=True)
    return proofs


def format_proofs(proofs: Sequence[FailProof]) -> str:
    rows = ["| patch | change | part | without the patch | verdict |", "|---|---|---|---|---|"]
    for proof in proofs:
        outcome = proof.without.summary() if proof.without else "-"
        rows.append(
            f"| {proof.patch.subject} | {proof.patch.change} | {proof.patch.part} "
            f"| {outcome} | {proof.verdict} |"
        )
    return "\n".join(rows)
