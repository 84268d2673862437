"""`vllm-fork test`: run the fork's own tests inside a materialized tree, and
prove that they can fail.

The tests of a patch are the ``tests/**/test_*.py`` modules the patch adds or
modifies. ``run_fork_tests`` runs all of them on the work tree as it is.

vLLM trees get the fork's ROCm simulation, kept once in the repository's
``sim/`` (package ``vllm_rocm_sim``): every pytest run in such a tree has
``sim/`` on its ``PYTHONPATH`` and loads ``-p vllm_rocm_sim.plugin``, and
``run_fork_tests`` also runs the simulation's self-test (``sim/tests``).

``prove_failing`` checks, for every ``change`` and ``hardening`` patch, that
its tests are real: they pass on the work tree (with the patch), and they
fail by a failing test on the tree without that patch (a detached worktree
at the patch's parent commit receiving the patch's test modules and nothing
else of it). Errors (collection, import, fixture setup), skips, or a missing
report are never a proof, neither with nor without the patch. ``tests``
patches pin behaviour the base already has, so they are expected to pass on
their parent and are reported, not judged; ``support`` patches carry test
infrastructure and are skipped.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from vllm_fork.config import find_root
from vllm_fork.diffs import is_test_module
from vllm_fork.errors import ConfigError, ForkError, WorkTreeError
from vllm_fork.facts.state import JUDGED_PARTS, PART_TESTS
from vllm_fork.git import run_git
from vllm_fork.tree.commits import series_commits

SIM_DIR = "sim"  # in the fork repository, next to bases.toml
SIM_PACKAGE = "vllm_rocm_sim"
SIM_PLUGIN = f"{SIM_PACKAGE}.plugin"
SIM_SELF_TEST = "tests"  # in SIM_DIR
# A patch whose tests need a GPU declares it; on a host without one it is
# reported, not judged (its proof is a run on a GPU host: bench/gpu/).
PROOF_TRAILER = "Fork-Proof"
PROOF_GPU = "gpu"
NO_GPU_HERE = "needs a GPU: not judged on this host (Fork-Proof: gpu)"


@dataclass(frozen=True)
class PatchCommit:
    sha: str
    subject: str
    change: str
    part: str
    test_files: tuple[str, ...]
    # ``Fork-Proof: gpu``: its tests need a CUDA/HIP GPU (they skip elsewhere)
    needs_gpu: bool = False


@dataclass(frozen=True)
class TestCase:
    """One ``<testcase>`` of a JUnit report: ``address`` is its class name and
    name dotted as pytest writes them (``tests.rocm.test_x.test_y``; a module
    that failed to import is ``tests.rocm.test_x``), ``result`` one of passed,
    failed, error, skipped."""

    address: str
    result: str


@dataclass(frozen=True)
class PytestOutcome:
    returncode: int
    tests: int
    failed: int
    errors: int
    skipped: int
    cases: tuple[TestCase, ...] = ()

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

    def of_files(self, files: Sequence[str]) -> PytestOutcome:
        """The part of this outcome that belongs to the test modules ``files``
        (as of a run over more modules); none of their cases in it is an error."""
        dotted = tuple(f.removesuffix(".py").replace("/", ".") for f in files)
        cases = tuple(
            c
            for c in self.cases
            if any(c.address == d or c.address.startswith(f"{d}.") for d in dotted)
        )
        count = {r: sum(c.result == r for c in cases) for r in ("failed", "error", "skipped")}
        if not cases:
            return PytestOutcome(self.returncode, tests=1, failed=0, errors=1, skipped=0)
        # The run's exit status speaks for every module in it; these modules' own
        # status is what their cases say (a failure elsewhere is not theirs).
        own = 1 if count["failed"] or count["error"] else 0
        return PytestOutcome(
            own,
            tests=len(cases),
            failed=count["failed"],
            errors=count["error"],
            skipped=count["skipped"],
            cases=cases,
        )


PROVEN = "fails without the patch"
NOT_PROVEN_NO_TESTS = "NOT PROVEN: the patch brings no tests"


@dataclass(frozen=True)
class FailProof:
    """The one rule of ``--prove-fail``: a judged patch is proven when its
    tests pass with it (``with_``: green, no error) and, without it, at least
    one test fails and none errors. Collection/import/setup errors and skips
    prove nothing: a test that cannot run cannot tell the patch's absence."""

    patch: PatchCommit
    without: PytestOutcome | None  # None: not judged (tests/support part, or no GPU here)
    with_: PytestOutcome | None = None

    @property
    def untested(self) -> bool:
        """A change or hardening patch that brings no test: nothing can prove it."""
        return self.patch.part in JUDGED_PARTS and not self.patch.test_files

    @property
    def counts(self) -> bool:
        """Whether the patch counts among those prove-fail judges (proven or not)."""
        return self.without is not None or self.untested

    @property
    def verdict(self) -> str:
        if self.untested:
            return NOT_PROVEN_NO_TESTS
        if self.without is None:
            if self.patch.part == PART_TESTS:
                return "pins upstream behaviour"
            if self.patch.needs_gpu and self.patch.part in JUDGED_PARTS:
                return NO_GPU_HERE
            return "not judged"
        if self.with_ is None or not self.with_.green:
            return "NOT PROVEN: its tests do not pass with the patch"
        if self.without.errors:
            return "NOT PROVEN: errors (not failures) without the patch"
        if self.without.failed:
            return PROVEN
        if self.without.passed == 0:
            return "NOT PROVEN: every test skipped without the patch"
        return "NOT PROVEN: passes without the patch"

    @property
    def ok(self) -> bool:
        return self.verdict in (
            PROVEN,
            "pins upstream behaviour",
            "not judged",
            NO_GPU_HERE,
        )


def is_vllm_tree(tree: Path) -> bool:
    return (tree / "vllm" / "__init__.py").is_file()


def sim_dir() -> Path:
    """The fork's ROCm simulation: ``sim/`` of the fork repository, found as
    ``bases.toml`` is (``$VLLM_FORK_ROOT``, the current directory or its
    parents, the checkout the tool runs from)."""
    path = find_root() / SIM_DIR
    if not (path / SIM_PACKAGE / "plugin.py").is_file():
        raise ConfigError(f"the fork repository has no ROCm simulation at {path / SIM_PACKAGE}")
    return path


def sim_plugin_args(tree: Path) -> list[str]:
    """Load the fork's ROCm simulation as a pytest plugin into a vLLM tree.

    The simulation must be active before vLLM resolves its platform, which
    the tree's root conftest does, so it cannot be a conftest itself.
    ``run_pytest`` puts its directory on ``PYTHONPATH``.
    """
    return ["-p", SIM_PLUGIN] if is_vllm_tree(tree) else []


def patch_commits(tree: Path) -> list[PatchCommit]:
    """The series commits of a materialized work tree, oldest first."""
    return [
        PatchCommit(
            sha=c.sha,
            subject=c.subject or c.sha,
            change=c.change,
            part=c.part,
            test_files=tuple(f for f in c.paths("A", "M") if is_test_module(f)),
            needs_gpu=(c.get(PROOF_TRAILER) or "").strip().lower() == PROOF_GPU,
        )
        for c in series_commits(tree)
    ]


def _count(suites: list[ET.Element], key: str) -> int:
    return sum(int(s.get(key, "0")) for s in suites)


def _case(element: ET.Element) -> TestCase:
    result = "passed"
    for tag in ("error", "failure", "skipped"):
        if element.find(tag) is not None:
            result = {"failure": "failed"}.get(tag, tag)
            break
    address = ".".join(filter(None, (element.get("classname", ""), element.get("name", ""))))
    return TestCase(address=address, result=result)


def parse_junit(path: Path, returncode: int) -> PytestOutcome:
    """Counts (and the test cases) from pytest's JUnit XML report: a test that
    raised in its body is a failure; collection, import and fixture problems
    are errors."""
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
        cases=tuple(_case(c) for s in suites for c in s.iter("testcase")),
    )


def run_pytest(
    tree: Path,
    python: str,
    files: Sequence[str],
    *,
    extra_args: Sequence[str] = (),
    timeout: float = 1800,
    quiet: bool = False,
    env: Mapping[str, str] | None = None,
) -> PytestOutcome:
    """Run pytest on ``files`` from the root of ``tree`` with ``python`` (in
    ``env``, default this process's environment). The tree is pytest's rootdir,
    whatever configuration lies above it (a tree in a cache inside a checkout
    whose pyproject.toml configures pytest): its report names the tests from
    the tree's root, as :func:`parse_junit`'s callers look them up."""
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
            f"--rootdir={tree}",
            *extra_args,
            *files,
        ]
        env = dict(os.environ if env is None else env)
        sim = [str(sim_dir())] if SIM_PLUGIN in extra_args else []
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tree), *sim, env.get("PYTHONPATH")]))
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


def sim_self_test_args(tree: Path, extra_args: Sequence[str]) -> tuple[list[str], list[str]]:
    """When the simulation is loaded: the extra pytest arguments and files that
    add its self-test to a run in ``tree``. The self-test lives outside the
    tree, so the tree's rootdir and configuration are named explicitly."""
    if SIM_PLUGIN not in extra_args:
        return [], []
    config = [f"--rootdir={tree}"]
    if (tree / "pyproject.toml").is_file():
        config += ["-c", str(tree / "pyproject.toml")]
    return config, [str(sim_dir() / SIM_SELF_TEST)]


def run_fork_tests(
    tree: Path, python: str, extra_args: Sequence[str] = (), *, quiet: bool = False
) -> PytestOutcome:
    """The series' test modules (and, in a vLLM tree, the simulation's self-test);
    ``quiet``: pytest's own output is dropped (the outcome says what ran)."""
    commits = patch_commits(tree)
    files = all_test_files(commits, tree)
    if not files:
        raise WorkTreeError(f"the series of {tree} adds no test modules")
    config, self_test = sim_self_test_args(tree, extra_args)
    return run_pytest(
        tree, python, [*files, *self_test], extra_args=[*config, *extra_args], quiet=quiet
    )


def prove_jobs() -> int:
    """How many pytest runs ``prove_failing`` keeps going at once:
    ``$VLLM_FORK_PROVE_JOBS``, or the CPUs this process may use (at most 4:
    each run imports vLLM and torch, about 1-2 GB)."""
    value = os.environ.get("VLLM_FORK_PROVE_JOBS", "").strip()
    if value:
        if not value.isdigit() or int(value) < 1:
            raise ConfigError(f"VLLM_FORK_PROVE_JOBS must be a positive integer, not {value!r}")
        return int(value)
    return max(1, min(4, len(os.sched_getaffinity(0))))


def prove_failing(
    tree: Path,
    python: str,
    extra_args: Sequence[str] = (),
    quiet: bool = True,
    jobs: int | None = None,
    log: Callable[[str], None] | None = None,
    only: Collection[str] | None = None,
) -> list[FailProof]:
    """Run each judged patch's tests on the tree with it (once, all together)
    and on the tree without that patch; up to ``jobs`` (default
    ``prove_jobs()``) of these runs at once, each in its own worktree. Every
    patch of the series gets a proof (a change or hardening patch with no
    tests: not proven). ``log`` gets one line as each run ends. ``only``: the
    commits (full ids) to prove, and to return proofs of; default every one."""
    commits = patch_commits(tree)
    if only is not None:
        commits = [c for c in commits if c.sha in only]
    tested = [c for c in commits if c.test_files]
    gpu = has_gpu(python) if any(c.needs_gpu for c in tested) else False
    judged = [c for c in tested if c.part in JUDGED_PARTS and (gpu or not c.needs_gpu)]
    total = len(judged) + 1
    done = [0]
    progress_lock = threading.Lock()

    def progress(what: str, outcome: PytestOutcome | None, t0: float) -> None:
        if log is None:
            return
        with progress_lock:
            done[0] += 1
            result = outcome.summary() if outcome is not None else "no tests"
            log(f"prove-fail: [{done[0]}/{total}] {what}: {result} ({time.monotonic() - t0:.0f} s)")

    present = all_test_files(judged, tree)
    # git serializes its own worktree bookkeeping badly under concurrency:
    # adding and removing worktrees is done one at a time, the runs are not.
    git_lock = threading.Lock()

    def run_with() -> PytestOutcome | None:
        t0 = time.monotonic()
        outcome = None
        if present:
            outcome = run_pytest(tree, python, present, extra_args=extra_args, quiet=quiet)
        progress("with every patch", outcome, t0)
        return outcome

    def run_without(commit: PatchCommit) -> PytestOutcome:
        t0 = time.monotonic()
        outcome = _run_without(commit)
        progress(f"without {commit.subject}", outcome, t0)
        return outcome

    def _run_without(commit: PatchCommit) -> PytestOutcome:
        scratch = Path(tempfile.mkdtemp(prefix="vllm-fork-without-"))
        worktree = scratch / "tree"
        try:
            with git_lock:
                run_git(["worktree", "add", "-q", "--detach", worktree, f"{commit.sha}^"], cwd=tree)
            run_git(["checkout", commit.sha, "--", *commit.test_files], cwd=worktree)
            return run_pytest(
                worktree, python, commit.test_files, extra_args=extra_args, quiet=quiet
            )
        finally:
            with git_lock:
                run_git(["worktree", "remove", "--force", worktree], cwd=tree, check=False)
                run_git(["worktree", "prune"], cwd=tree, check=False)
            shutil.rmtree(scratch, ignore_errors=True)

    with ThreadPoolExecutor(max_workers=jobs or prove_jobs()) as pool:
        with_future = pool.submit(run_with)
        without = {c.sha: pool.submit(run_without, c) for c in judged}
        with_all = with_future.result()
        proofs = []
        for commit in commits:
            if commit not in judged:
                proofs.append(FailProof(commit, None))
                continue
            with_ = with_all.of_files(commit.test_files) if with_all else None
            proofs.append(FailProof(commit, without[commit.sha].result(), with_))
    return proofs


def check_head(
    tree: Path, python: str, extra_args: Sequence[str] = (), rev: str = "HEAD"
) -> tuple[PytestOutcome, FailProof | None]:
    """The fork tests of ``tree`` and the prove-fail of the patch at its HEAD
    (``rev``: another commit of its series), run side by side (None: it is not a
    series commit)."""
    head = run_git(["rev-parse", f"{rev}^{{commit}}"], cwd=tree).stdout.decode().strip()
    with ThreadPoolExecutor(max_workers=2) as pool:
        tests = pool.submit(run_fork_tests, tree, python, extra_args, quiet=True)
        proofs = pool.submit(prove_failing, tree, python, extra_args, jobs=1, only={head})
        return tests.result(), next(iter(proofs.result()), None)


def has_gpu(python: str) -> bool:
    """Whether torch in the tree's interpreter sees a CUDA or HIP GPU."""
    probe = Path(__file__).with_name("has_gpu.py")
    return subprocess.run([python, str(probe)], capture_output=True).returncode == 0


def format_proofs(proofs: Sequence[FailProof]) -> str:
    rows = [
        "| patch | change | part | with the patch | without the patch | verdict |",
        "|---|---|---|---|---|---|",
    ]
    for proof in proofs:
        with_ = proof.with_.summary() if proof.with_ else "-"
        without = proof.without.summary() if proof.without else "-"
        rows.append(
            f"| {proof.patch.subject} | {proof.patch.change} | {proof.patch.part} "
            f"| {with_} | {without} | {proof.verdict} |"
        )
    return "\n".join(rows)


@dataclass(frozen=True)
class TreeCheck:
    """`vllm-fork test`: the fork tests of a work tree and, when asked, the
    prove-fail of each of its patches."""

    outcome: PytestOutcome
    proofs: tuple[FailProof, ...] | None = None  # None: prove-fail not asked for

    @property
    def proven(self) -> bool:
        return self.proofs is None or all(proof.ok for proof in self.proofs)

    @property
    def ok(self) -> bool:
        return self.outcome.green and self.proven


def check_tree(
    tree: Path,
    python: str,
    pytest_args: Sequence[str] = (),
    *,
    prove: bool = False,
    log: Callable[[str], None] | None = None,
) -> TreeCheck:
    """The fork tests of ``tree`` with ``python`` (in the ROCm simulation where the
    tree has it), and with ``prove`` each change/hardening patch's tests without it."""
    tree = tree.absolute()
    if os.sep in python:
        # pytest runs from the tree's root: a relative interpreter path must not move
        python = str(Path(python).absolute())
    extra = [*sim_plugin_args(tree), *pytest_args]
    outcome = run_fork_tests(tree, python, extra)
    proofs = tuple(prove_failing(tree, python, extra, log=log)) if prove else None
    return TreeCheck(outcome, proofs)
