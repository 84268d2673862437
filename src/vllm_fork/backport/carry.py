"""`vllm-fork backport`: carry one fork commit to every base that has its code.

The stable-kernel way: a fix has one identity (its ``Fork-Patch`` trailer, or
its subject), it is written once on one base's work tree and cherry-picked
into every other base; a base it does not apply to is reported, never skipped
silently. For each target base (every base with a series, or those named):

1. materialize the base into the tool's work area;
2. decide whether the commit is for it: a base whose series already carries
   the patch is ``already carried`` (one that conflicted earlier in the run and
   was finished by hand is ``resolved by hand``: its patch gets step 4); a
   base where the probes say the code is absent (the ``affected`` probe of a
   known issue the commit fixes, the change registry's first release, or none
   of the files it changes) or already fixed (the issue's ``fixed`` probe) is ``not applicable``;
3. apply it (:func:`apply_commit`, through the one applier of
   :mod:`vllm_fork.tree.apply`: exactly, else git's 3-way ``ort`` merge with
   rename detection, as a cherry-pick): ``applied clean`` when the diff
   applies as it is, ``adapted by 3-way`` when the merge had to move or
   re-fit it, ``conflict`` otherwise
   (the report prints the commands that resolve it by hand);
4. run the base's fork tests and the prove-fail of the new patch (the
   injected check runner), the bases in parallel, bounded by the CPUs;
5. export the base's series into a staging copy of ``series/``.

Only when every target base is applied (clean or adapted) with green checks,
or not applicable, are the staged files written into ``series/``: the files
to write are recorded first, then copied, so that a run killed while writing
finishes the write when it is run again. A kill at any other point leaves
``series/`` untouched; the state (``<cache>/backport/<key>/state.json``, one
result per base as soon as it is known) makes the next run of the same
command go on where it stopped. Export goes through ``materialize`` +
commit + ``export``, so the series are stored however ``export`` stores them.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from packaging.version import Version

from vllm_fork import __version__, faults
from vllm_fork.atomic import place_dir, write_json_atomic
from vllm_fork.config import BASES_FILE
from vllm_fork.errors import ForkError, UsageError
from vllm_fork.facts import registry
from vllm_fork.facts.known_issues import FIXES_TRAILER
from vllm_fork.git import git_env, git_out, run_git
from vllm_fork.series import store
from vllm_fork.series.patches import TrailerFields, series_digest
from vllm_fork.sources.workspace import Workspace, load_config
from vllm_fork.sourcetree import DirTree
from vllm_fork.transaction import StateFile, TreeCommit, plan_writes
from vllm_fork.tree import apply
from vllm_fork.tree.apply import applier, repo_of, tree_of
from vllm_fork.tree.commits import SeriesCommit, read_commits, series_commits, tree_base
from vllm_fork.tree.export import FORMAT_PATCH, export
from vllm_fork.tree.materialize import REPO_KEY, am_env, materialize

log = logging.getLogger(__name__)

SCHEMA = 1
PATCH_TRAILER = "Fork-Patch"
SOURCE_REF = "refs/backport/source"

CLEAN = "applied clean"
ADAPTED = "adapted by 3-way"
CONFLICT = "conflict"
NOT_APPLICABLE = "not applicable"
CARRIED = "already carried"
# a base that conflicted, was finished by hand (resolved, exported) and is checked
# on the next run like the bases the commit applied to
RESOLVED = "resolved by hand"
FAILED = "failed"
# verdicts that let the series be written
ACCEPTED = (CLEAN, ADAPTED, NOT_APPLICABLE, CARRIED, RESOLVED)
APPLIED = (CLEAN, ADAPTED)


def patch_identity(fields: TrailerFields, subject: str) -> str:
    """A patch's identity across bases: its ``Fork-Patch`` trailer, else its subject."""
    return (fields.get(PATCH_TRAILER) or "").strip() or subject.strip()


def carries(config: Workspace, version: str, identity: str) -> str | None:
    """The patch file of series/<version> that carries ``identity`` (None: none)."""
    if not store.has_series(config.series_root, version):
        return None
    series = config.series(version, validate=False)
    for path, header in zip(series.patches, series.headers, strict=True):
        if patch_identity(header, header.subject) == identity:
            return path.name
    return None


# --- the one apply step -------------------------------------------------------------


@dataclass(frozen=True)
class Applied:
    """What :func:`apply_commit` did: ``verdict`` one of CLEAN, ADAPTED,
    CONFLICT, NOT_APPLICABLE (the change is already in the tree: empty pick);
    ``files`` the conflicted paths."""

    verdict: str
    detail: str = ""
    files: tuple[str, ...] = ()


def apply_commit(tree: Path, commit: str) -> Applied:
    """Apply ``commit`` (present in ``tree``'s object store) on top of HEAD
    as one new commit, with the one applier (:mod:`vllm_fork.tree.apply`):
    exactly when the diff applies as it is, else git's 3-way ``ort`` merge
    with rename detection, as a cherry-pick makes it. The commit's author and
    message are kept; the committer is the fork's fixed identity (as
    materialize's). On a conflict or an empty result nothing is committed."""
    repo = repo_of(tree)
    head = tree_of(repo, "HEAD")
    diff = run_git(["diff-tree", "-p", "--binary", "--full-index", f"{commit}^", commit], cwd=tree)
    with applier(repo) as one:
        result = one.apply(head, diff.stdout, tree_of(repo, f"{commit}^"), tree_of(repo, commit))
    if result.status == apply.EMPTY:
        return Applied(NOT_APPLICABLE, "the change is already in this base (the pick is empty)")
    if result.status == apply.CONFLICT:
        files = tuple(result.conflicts)
        return Applied(CONFLICT, f"{len(files)} file(s) conflict", files)
    name, email, date = git_out(
        ["log", "-1", "--format=%an%x00%ae%x00%ad", "--date=raw", commit], cwd=tree
    ).split("\0")
    raw = run_git(["cat-file", "commit", commit], cwd=tree).stdout
    message = raw.split(b"\n\n", 1)[1] if b"\n\n" in raw else b""
    env = {
        **am_env(),
        "GIT_AUTHOR_NAME": name,
        "GIT_AUTHOR_EMAIL": email,
        "GIT_AUTHOR_DATE": date,
        "GIT_COMMITTER_DATE": date,
    }
    new = (
        run_git(["commit-tree", result.tree, "-p", "HEAD"], cwd=tree, env=env, input=message)
        .stdout.decode()
        .strip()
    )
    run_git(["reset", "-q", "--hard", new], cwd=tree)
    if result.status == apply.CLEAN:
        return Applied(CLEAN)
    return Applied(ADAPTED, result.detail())


# --- is the commit for this base? ---------------------------------------------------


def not_applicable(config: Workspace, version: str, commit: SeriesCommit, tree: Path) -> str | None:
    """Why the commit is not for the base materialized in ``tree`` (None: it is).

    The probes decide: a known issue the commit fixes (``Fork-Fixes``) whose
    ``affected`` probe does not hold (the code is absent, or the AITER pin has the
    fix) or whose ``fixed``
    probe already holds; the change registry's first release with the code
    the change modifies; else none of the files the commit changes exists."""
    source = DirTree(tree)
    issues = {i.id: i for i in config.known_issues}
    fixes = [issues[i] for i in commit.values(FIXES_TRAILER) if i in issues]
    for issue in fixes:
        affected, why = issue.affected.check(source)
        if not affected:
            return f"{issue.id}: not affected ({why})"
        if issue.fixed is not None:
            fixed, fix_why = issue.fixed.check(source)
            if fixed:
                return f"{issue.id}: already fixed ({fix_why})"
    if fixes:
        return None
    change = registry.find(commit.change) if commit.change else None
    if change is not None and change.expected_upstream(version) == "n/a":
        return f"{change.id}: the code it modifies arrives in {change.applies_since}"
    changed = commit.paths("M", "D", "T")
    if changed and not any((tree / path).exists() for path in changed):
        return "none of the files it changes exists: " + ", ".join(changed[:5])
    return None


# --- the checks of one base ----------------------------------------------------------


@dataclass(frozen=True)
class Checks:
    """The fork tests of a base and the prove-fail of the backported patch."""

    tests: str
    proof: str
    ok: bool


# (base version, work tree, the commit of its series to prove: "HEAD" where the
# commit was just applied) -> its checks; the command line passes the fork
# tests' runner (vllm_fork.backport.checks.fork_checks)
CheckRunner = Callable[[str, Path, str], Checks]


# --- state -------------------------------------------------------------------------


@dataclass
class BaseResult:
    version: str
    verdict: str
    reason: str = ""
    files: list[str] = field(default_factory=list)
    tests: str = ""
    proof: str = ""
    seconds: float = 0.0
    # the series/<V> digest the result was made from: a changed series redoes it
    series: str = ""

    @property
    def accepted(self) -> bool:
        return self.verdict in ACCEPTED


@dataclass
class Source:
    version: str
    commit: str
    identity: str
    subject: str


def _digest_dir(directory: Path) -> str:
    digest = hashlib.sha256()
    if directory.is_dir():
        for path in sorted(directory.rglob("*")):
            if path.is_file():
                digest.update(f"{path.relative_to(directory)}\0".encode() + path.read_bytes())
    return digest.hexdigest()


@dataclass
class Report:
    source: Source
    results: list[BaseResult]
    written: list[str]
    state_dir: Path
    reused: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(r.accepted for r in self.results)

    def to_json(self) -> dict[str, Any]:
        return {
            "source": asdict(self.source),
            "ok": self.ok,
            "written": self.written,
            "results": [asdict(r) for r in self.results],
            "reused": self.reused,
        }


class Backport:
    """One backport run (see the module docstring); ``state_dir`` holds its state."""

    def __init__(self, config: Workspace, state_dir: Path, source: Source) -> None:
        self.config = config
        self.state_dir = state_dir
        self.source = source
        self.state_file = StateFile(
            state_dir / "state.json", SCHEMA, tool=__version__, what="backport state"
        )
        self.stage = state_dir / "stage"
        self.source_git = state_dir / "source.git"
        self._lock = threading.Lock()
        self._export_lock = threading.Lock()
        self.state = self._load()

    def _load(self) -> dict[str, Any]:
        return self.state_file.load() or {"results": {}}

    def save(self) -> None:
        with self._lock:
            self.state_file.save(self.state)

    @property
    def transaction(self) -> TreeCommit:
        """Writing the staged series into series/ (journaled in the state)."""
        return TreeCommit(self.state, self.save, fault="backport.commit")

    # -- results --

    def recorded(self, version: str) -> BaseResult | None:
        data = self.state["results"].get(version)
        if data is None:
            return None
        result = BaseResult(**data)
        if not result.accepted:
            return None  # a conflict or a failure is tried again
        if result.series != series_digest(self.config.series_dir(version)):
            return None  # the base's series changed since: redo it
        if result.verdict in APPLIED and not store.has_series(self.stage / "series", version):
            return None
        return result

    def record(self, result: BaseResult) -> None:
        with self._lock:
            self.state["results"][result.version] = asdict(result)
            if result.verdict == CONFLICT:
                # kept when the result is forgotten: once the base carries the
                # patch (finished by hand), it is checked, not taken as carried
                conflicted = self.state.setdefault("conflicted", [])
                if result.version not in conflicted:
                    conflicted.append(result.version)
        self.save()

    def finished_by_hand(self, version: str) -> bool:
        """Whether ``version`` conflicted in this run and now carries the patch."""
        return version in self.state.get("conflicted", [])

    # -- staging --

    def ensure_stage(self) -> None:
        """A copy of the repository's ``bases.toml`` and ``series/`` that the
        bases export into; made once per run (kept across a resume)."""
        start = _digest_dir(self.config.series_root)
        if self.stage.is_dir() and self.state.get("series_at_start") == start:
            return
        tmp = self.state_dir / "stage.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        shutil.copy2(self.config.bases_file, tmp / BASES_FILE)
        if self.config.known_issues_file.is_file():
            shutil.copy2(self.config.known_issues_file, tmp / self.config.known_issues_file.name)
        shutil.copytree(self.config.series_root, tmp / "series", symlinks=True)
        if self.stage.is_dir():
            # series/ changed since (e.g. a conflict resolved by hand and exported):
            # keep what the bases whose own series did not change exported
            old = self.stage / "series"
            for version in list(self.state["results"]):
                kept = self.recorded(version)
                if kept is None:
                    del self.state["results"][version]
                elif kept.verdict in APPLIED:
                    store.update_base(tmp / "series", version, store.read_base(old, version))
            shutil.rmtree(self.stage)
        place_dir(tmp, self.stage)
        self.state["series_at_start"] = start
        self.save()

    def export_to_stage(self, tree: Path) -> None:
        stage_config = load_config(
            root=self.stage, cache_dir=self.config.cache_dir, offline=self.config.offline
        )
        run_git(["config", REPO_KEY, str(stage_config.root)], cwd=tree)
        with self._export_lock:
            export(stage_config, tree)

    def commit(self) -> list[str]:
        """Write the staged series into series/ (all of them, or, when killed,
        all of them on the next run)."""
        real, staged = self.config.series_root, self.stage / "series"
        transaction = self.transaction
        write: list[str] = []
        remove: list[str] = []
        if transaction.journal is None:
            if _digest_dir(real) != self.state.get("series_at_start"):
                raise UsageError(
                    "series/ changed while the backport ran; run it again with --restart"
                )
            write, remove = plan_writes(real, staged)
            # the series files last: until one is replaced it names only pool files there
            write.sort(key=store.commit_order)

        def through_the_store() -> None:
            # the store's one writer: pool files first, then each base's series file,
            # then what no series names; idempotent, so a killed run's rerun finishes it
            store.write_store(real, store.read_all(staged))

        return transaction.run(real, staged, write, remove, apply=through_the_store)

    # -- one base --

    def work_tree(self, version: str) -> Path:
        return self.config.cache.work / f"backport-{self.state_dir.name}-{version}"

    def carry(self, version: str, checks: CheckRunner) -> BaseResult:
        """Carry the commit to one base, start to end."""
        prepared = self.prepare(version)
        if isinstance(prepared, BaseResult):
            return prepared
        return self.finish(prepared, checks)

    def prepare(self, version: str) -> BaseResult | Prepared:
        """Materialize, decide and apply: the recorded result of a base that
        stops here, or its work tree with the commit applied."""
        t0 = time.monotonic()
        series = series_digest(self.config.series_dir(version))
        carried = carries(self.config, version, self.source.identity)
        if carried is not None and not self.finished_by_hand(version):
            return self._done(BaseResult(version, CARRIED, f"series/{version}/{carried}"), t0)
        tree = self.work_tree(version)
        shutil.rmtree(tree, ignore_errors=True)  # ours, from a killed run
        try:
            materialize(self.config, version, tree, internal=True)
            if carried is not None:
                # finished by hand: its series' patch gets the checks of the others
                sha = [
                    c.sha
                    for c in series_commits(tree)
                    if patch_identity(c, c.subject) == self.source.identity
                ][-1]
                detail = f"its series carries the resolved patch ({carried})"
                return Prepared(version, tree, Applied(RESOLVED, detail), series, t0, sha)

            run_git(["fetch", "-q", self.source_git, SOURCE_REF], cwd=tree)
            (commit,) = read_commits(tree, [self.source.commit])
            why = not_applicable(self.config, version, commit, tree)
            if why is not None:
                result = BaseResult(version, NOT_APPLICABLE, why)
            else:
                applied = apply_commit(tree, self.source.commit)
                if applied.verdict in APPLIED:
                    return Prepared(version, tree, applied, series, t0)
                result = BaseResult(version, applied.verdict, applied.detail, list(applied.files))
        except ForkError as exc:
            result = _failure(version, exc)
        shutil.rmtree(tree, ignore_errors=True)
        result.series = series
        return self._done(result, t0)

    def finish(self, prepared: Prepared, checks: CheckRunner) -> BaseResult:
        """The checks of a base the commit applied to, and its export."""
        version, applied = prepared.version, prepared.applied
        try:
            outcome = checks(version, prepared.tree, prepared.rev)
            if outcome.ok:
                if applied.verdict != RESOLVED:  # series/ carries that one already
                    self.export_to_stage(prepared.tree)
                verdict, reason = applied.verdict, applied.detail
            else:
                verdict, reason = FAILED, f"{applied.verdict}, but the checks fail"
            result = BaseResult(version, verdict, reason, tests=outcome.tests, proof=outcome.proof)
        except ForkError as exc:
            result = _failure(version, exc)
        finally:
            shutil.rmtree(prepared.tree, ignore_errors=True)
        result.series = prepared.series
        return self._done(result, prepared.started)

    def _done(self, result: BaseResult, started: float) -> BaseResult:
        result.seconds = round(time.monotonic() - started, 1)
        self.record(result)
        faults.point("backport.base")
        detail = f" ({result.reason})" if result.reason else ""
        log.info("backport: %s: %s%s", result.version, result.verdict, detail)
        return result


@dataclass(frozen=True)
class Prepared:
    """A base's work tree with the commit applied, waiting for its checks."""

    version: str
    tree: Path
    applied: Applied
    series: str
    started: float
    rev: str = "HEAD"  # the commit to prove: HEAD, or the hand-resolved patch's


def _failure(version: str, exc: ForkError) -> BaseResult:
    first = str(exc).strip().splitlines()
    return BaseResult(version, FAILED, first[0] if first else type(exc).__name__)


# --- the source ---------------------------------------------------------------------


def _state_key(tree: Path, commit: str) -> str:
    """The same commit content gives the same key (the run resumes)."""
    patch = run_git(
        [*FORMAT_PATCH, "--stdout", "-1", commit], cwd=tree, env=git_env(isolated=True)
    ).stdout
    return hashlib.sha256(patch).hexdigest()[:16]


def _keep_source(config: Workspace, state_dir: Path, tree: Path, commit: str) -> None:
    """Copy the commit into the run's own repository (it shares upstream's objects)."""
    repo = state_dir / "source.git"
    if not (repo / "HEAD").is_file():
        tmp = state_dir / "source.git.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        run_git(["init", "-q", "--bare", tmp], env=git_env(isolated=True))
        alternates = tmp / "objects" / "info" / "alternates"
        alternates.write_text(f"{(config.upstream_repo / 'objects').resolve()}\n")
        place_dir(tmp, repo)
    run_git(["fetch", "-q", "--no-tags", tree, f"+{commit}:{SOURCE_REF}"], cwd=repo)


def source_from_tree(config: Workspace, tree: Path, rev: str = "HEAD") -> tuple[Source, Path]:
    """The commit ``rev`` of the materialized work tree ``tree``: one commit of
    its series (after ``upstream/<V>``)."""
    tree = tree.absolute()
    version = tree_base(tree)
    proc = run_git(["rev-parse", "--verify", "-q", f"{rev}^{{commit}}"], cwd=tree, check=False)
    if proc.returncode != 0:
        raise UsageError(f"{tree} has no commit {rev}")
    sha = proc.stdout.decode().strip()
    commits = {c.sha: c for c in series_commits(tree)}
    if sha not in commits:
        raise UsageError(
            f"{rev} ({sha[:12]}) is not a series commit of {tree} (after upstream/{version})"
        )
    commit = commits[sha]
    source = Source(version, sha, patch_identity(commit, commit.subject), commit.subject)
    state_dir = config.cache.backport_run(_state_key(tree, sha))
    state_dir.mkdir(parents=True, exist_ok=True)
    _keep_source(config, state_dir, tree, sha)
    return source, state_dir


def source_from_patch(
    config: Workspace, identity: str, versions: Sequence[str], from_version: str | None
) -> tuple[Source, Path]:
    """The patch ``identity`` (Fork-Patch id or subject) as a series carries it:
    ``from_version``'s, else the newest base's that carries it."""
    holders = [v for v in versions if carries(config, v, identity)]
    if from_version is not None:
        if from_version not in holders:
            raise UsageError(f"series/{from_version} carries no patch {identity!r}")
        chosen = from_version
    elif holders:
        chosen = max(holders, key=Version)
    else:
        raise UsageError(f"no series carries a patch {identity!r} (Fork-Patch id or subject)")
    scratch = config.cache.work / f"backport-source-{chosen}"
    shutil.rmtree(scratch, ignore_errors=True)
    materialize(config, chosen, scratch, internal=True)
    try:
        found = [c for c in series_commits(scratch) if patch_identity(c, c.subject) == identity]
        return source_from_tree(config, scratch, found[-1].sha)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


# --- the command --------------------------------------------------------------------


def cpu_jobs() -> int:
    return max(1, len(os.sched_getaffinity(0)))


def backport(
    config: Workspace,
    source: Source,
    state_dir: Path,
    targets: Sequence[str],
    checks: CheckRunner,
    *,
    jobs: int | None = None,
    restart: bool = False,
) -> Report:
    """Carry ``source`` to ``targets`` (resuming a killed run of the same
    commit unless ``restart``) and write every target's series, or none."""
    if restart:
        for name in ("state.json", "stage"):
            path = state_dir / name
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink(missing_ok=True)
    run = Backport(config, state_dir, source)
    run.state["source"] = asdict(source)
    run.state["targets"] = list(targets)
    if run.transaction.interrupted:
        finished = run.commit()  # a run killed while writing: finish it first
        return Report(source, _results(run, targets), finished, state_dir, list(targets))
    if run.transaction.done:
        # a finished run of the same commit: the series now carry it; start afresh
        run.state = {"results": {}}
        shutil.rmtree(run.stage, ignore_errors=True)
    run.ensure_stage()
    reused = []
    todo = []
    for version in targets:
        if run.recorded(version) is not None:
            reused.append(version)
        else:
            todo.append(version)
    # Every base is materialized and applied while the checks of the bases
    # already applied run (a check runner may take one base at a time).
    workers = jobs or cpu_jobs()
    with (
        ThreadPoolExecutor(max_workers=workers) as preparing,
        ThreadPoolExecutor(max_workers=workers) as checking,
    ):
        pending = [preparing.submit(run.prepare, v) for v in todo]
        finishing: list[Future[BaseResult]] = []
        for done in as_completed(pending):
            prepared = done.result()
            if isinstance(prepared, Prepared):
                finishing.append(checking.submit(run.finish, prepared, checks))
        for future in finishing:
            future.result()
    results = _results(run, targets)
    written: list[str] = []
    if all(r.accepted for r in results):
        written = run.commit()
    return Report(source, results, written, state_dir, reused)


def _results(run: Backport, targets: Iterable[str]) -> list[BaseResult]:
    out = []
    for version in targets:
        data = run.state["results"].get(version)
        out.append(BaseResult(**data) if data else BaseResult(version, FAILED, "no result"))
    return out


def select_targets(config: Workspace, wanted: Sequence[str] | None) -> list[str]:
    """``wanted`` (each must be pinned), else every base with a series, oldest first."""
    pins = config.pins
    if wanted:
        for version in wanted:
            pins.get(version)
        return sorted(set(wanted), key=Version)
    return [v for v in pins.versions() if store.has_series(config.series_root, v)]


def carry_commit(
    config: Workspace,
    *,
    tree: Path | None,
    commit: str,
    patch: str | None,
    from_version: str | None,
    bases: Sequence[str] | None,
    checks: CheckRunner,
    jobs: int | None = None,
    restart: bool = False,
) -> Report:
    """`vllm-fork backport`: the commit ``commit`` of the work tree ``tree``, or the
    series patch ``patch`` (its copy on ``from_version``, default the newest), carried
    to ``bases`` (default: every base with a series)."""
    if jobs is not None and jobs < 1:
        raise UsageError("--jobs must be at least 1")
    if from_version and not patch:
        raise UsageError("--from goes with --patch")
    targets = select_targets(config, bases)
    if tree is not None:
        source, state_dir = source_from_tree(config, tree, commit)
    else:
        assert patch is not None
        # the patch is looked for on every base with a series, not only the targets
        holders = select_targets(config, None)
        source, state_dir = source_from_patch(config, patch, holders, from_version)
    return backport(config, source, state_dir, targets, checks, jobs=jobs, restart=restart)


def write_json(report: Report, path: Path) -> None:
    """The report as JSON (``--json FILE``), written whole or not at all."""
    write_json_atomic(path, report.to_json())


# --- the report ---------------------------------------------------------------------


def resolve_commands(report: Report, result: BaseResult) -> list[str]:
    """How to carry the commit to a base where it conflicts, by hand."""
    v = result.version
    d = f"backport-{v}"
    files = " ".join(result.files) or "FILES"
    return [
        f"vllm-fork materialize --base {v} {d}",
        f"git -C {d} fetch {report.state_dir / 'source.git'} {SOURCE_REF}",
        f"git -C {d} -c merge.renames=true -c merge.directoryRenames=false "
        "cherry-pick FETCH_HEAD || true   # stops at the conflict",
        f"# edit {files}, then: git -C {d} add {files} && git -C {d} cherry-pick --continue",
        f"vllm-fork export {d}   # series/{v} then carries it; run the backport again",
    ]


def format_report(report: Report) -> str:
    s = report.source
    lines = [f"backport of {s.identity!r} ({s.subject}) from {s.version} ({s.commit[:12]})", ""]
    rows = [("base", "verdict", "checks", "detail")]
    for r in report.results:
        checks = "; ".join(filter(None, [r.tests, r.proof]))
        rows.append((r.version, r.verdict, checks, r.reason))
    widths = [max(len(row[c]) for row in rows) for c in range(3)]
    for n, row in enumerate(rows):
        lines.append("  ".join(f"{row[c]:<{widths[c]}}" for c in range(3)) + "  " + row[3])
        if n == 0:
            lines.append("  ".join("-" * w for w in widths) + "  ------")
    for r in report.results:
        if r.verdict == CONFLICT:
            lines += ["", f"{r.version}: {r.reason}; to carry it by hand:"]
            lines += [f"  {c}" for c in resolve_commands(report, r)]
    lines.append("")
    if report.written:
        lines.append(f"series written: {len(report.written)} file(s) under series/")
    elif report.ok:
        lines.append("nothing to write: every base carries the patch or is not applicable")
    else:
        bad = [r.version for r in report.results if not r.accepted]
        lines.append(
            f"series/ left untouched: {', '.join(bad)} not carried; resolve them (or leave "
            "them out with --bases) and run the same command again (the other bases are kept)"
        )
    if report.reused:
        lines.append(f"taken from the interrupted run: {', '.join(report.reused)}")
    return "\n".join(lines)
