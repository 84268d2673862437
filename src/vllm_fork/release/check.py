"""`vllm-fork release-check`: every base end to end, resumable.

For each base checked (bases.toml ``supported = true``, plus any base with
a series): materialize base + series, run the fork tests, prove every
judged patch's tests fail without it, build the precompiled wheel (the
build verifies it) and install it. With the default base, also the tool's
release tests (``pytest -m release`` of the checkout's ``tests/``: the long
checks the test command leaves out; vllm_fork/testing/toolsuite.py); their
record is redone when the tool's sources change. Every step's result is written to
``<cache>/release-check/<V>.json`` as soon as it is known, together with
the digest of the inputs (series, tool version, sdist, upstream wheel,
torch spec). A rerun skips the steps already recorded for the same inputs,
so a killed run goes on where it stopped and a base whose inputs did not
change is not redone (``--force`` redoes it). A step that cannot run
(no series, a refused build, a test run that dies) is recorded with its
reason; the other bases go on.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from packaging.version import Version

from vllm_fork import __version__
from vllm_fork.atomic import write_bytes_atomic, write_json_atomic
from vllm_fork.config import KNOWN_ISSUES_FILE, torch_spec
from vllm_fork.deploy.release_files import release_files
from vllm_fork.errors import ForkError, UsageError
from vllm_fork.facts.known_issues import AFFECTED, FIXES_TRAILER, affected
from vllm_fork.facts.names import tag_for
from vllm_fork.facts.triage import TRIAGE_FILE
from vllm_fork.hashing import sha256_bytes, sha256_file
from vllm_fork.probes import DirTree, GitTree
from vllm_fork.probes.issues import known_issue_states
from vllm_fork.reports.watch import untriaged_for_base
from vllm_fork.series import store
from vllm_fork.series.patches import series_digest
from vllm_fork.sources.pins import Pins
from vllm_fork.sources.workspace import Workspace
from vllm_fork.testing import treevenv
from vllm_fork.testing.forktests import prove_failing, run_fork_tests, sim_plugin_args
from vllm_fork.testing.gpuresults import last_gpu_run
from vllm_fork.testing.toolsuite import run_release_tests, sources_digest
from vllm_fork.transaction import StateFile
from vllm_fork.tree.commits import series_commits
from vllm_fork.tree.materialize import materialize
from vllm_fork.wheel.audit import record_hashes, sdist_wheel_disagreements
from vllm_fork.wheel.builder import BuildRefused, BuildRequest, build
from vllm_fork.wheel.smoke import smoke
from vllm_fork.wheel.wheelfile import Wheel

log = logging.getLogger(__name__)

SCHEMA = 1
TOOL_TESTS = "tool-tests"
STEPS = ("materialize", "known-issues", "tests", "prove-fail", "wheel", "install", TOOL_TESTS)
# the steps that build or need a wheel (left out by --no-wheel)
WHEEL_STEPS = ("wheel", "install", TOOL_TESTS)
# the steps of the default base only
DEFAULT_BASE_STEPS = (TOOL_TESTS,)
# a step that needs another's result: the step it needs, and what is missing without it
NEEDS = {
    "known-issues": ("materialize", "no work tree"),
    "tests": ("materialize", "no work tree"),
    "prove-fail": ("materialize", "no work tree"),
    "install": ("wheel", "no wheel"),
}
OK = "ok"
FAILED = "failed"
NOT_RUN = "not run"

Step = Callable[["Context"], dict[str, Any]]


class StepFailed(ForkError):
    """A step ran and its result is a failure; ``data`` is what it found."""

    def __init__(self, message: str, data: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.data = data or {}


def state_dir(config: Workspace) -> Path:
    return config.cache.release_check


def state_file(config: Workspace, version: str) -> Path:
    return state_dir(config) / f"{version}.json"


def has_series(config: Workspace, version: str) -> bool:
    return store.has_series(config.series_root, version)


def select_bases(config: Workspace, pins: Pins, wanted: Sequence[str] | None) -> list[str]:
    """``wanted`` (each must be pinned), else every supported base and every base
    with a series, oldest first."""
    if wanted:
        for version in wanted:
            pins.get(version)  # an unknown version is a usage error naming the pinned ones
        return sorted(set(wanted), key=Version)
    return [v for v in pins.versions() if pins.bases[v].supported or has_series(config, v)]


def _series_digest(config: Workspace, version: str) -> str | None:
    """The base's :func:`~vllm_fork.series.patches.series_digest` (None: no series)."""
    if not store.has_series(config.series_root, version):
        return None
    return series_digest(config.series_dir(version))


def inputs(config: Workspace, pins: Pins, version: str, torch: str, wheel: bool) -> dict[str, Any]:
    """What a base's result depends on; a change in any of it redoes the base."""
    base = pins.get(version)
    return {
        "schema": SCHEMA,
        "series": _series_digest(config, version),
        "tool": __version__,
        "sdist": base.sdist.sha256,
        "wheel": base.wheel.sha256 if base.wheel else None,
        "torch": torch,
        "build": wheel,
        "known_issues": _file_digest(config.root / KNOWN_ISSUES_FILE),
        "triage": _file_digest(config.root / TRIAGE_FILE),
    }


def _file_digest(path: Path) -> str | None:
    try:
        return sha256_file(path)
    except FileNotFoundError:
        return None


def inputs_digest(data: dict[str, Any]) -> str:
    return sha256_bytes(json.dumps(data, sort_keys=True).encode())


@dataclass
class BaseState:
    """The recorded result of one base: ``steps[name]`` holds ``status``,
    ``seconds``, ``reason`` (when not ok) and the step's figures."""

    version: str
    digest: str
    inputs: dict[str, Any]
    steps: dict[str, dict[str, Any]] = field(default_factory=dict)
    tree: str | None = None
    finished: bool = False
    checked_at: str | None = None
    # fields this version of the tool does not know (a newer tool's), carried as they are
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def seconds(self) -> float:
        return sum(float(s.get("seconds", 0.0)) for s in self.steps.values())

    @property
    def passed(self) -> bool:
        return self.finished and all(s.get("status") == OK for s in self.steps.values())

    def to_json(self) -> dict[str, Any]:
        return {
            **self.extra,
            "schema": SCHEMA,
            "version": self.version,
            "digest": self.digest,
            "inputs": self.inputs,
            "steps": self.steps,
            "tree": self.tree,
            "finished": self.finished,
            "checked_at": self.checked_at,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> BaseState:
        return cls(
            version=str(data["version"]),
            digest=str(data["digest"]),
            inputs=dict(data.get("inputs", {})),
            steps={str(k): dict(v) for k, v in data.get("steps", {}).items()},
            tree=data.get("tree"),
            finished=bool(data.get("finished", False)),
            checked_at=data.get("checked_at"),
            extra={k: v for k, v in data.items() if k not in _STATE_KEYS},
        )


_STATE_KEYS = frozenset(
    ("schema", "version", "digest", "inputs", "steps", "tree", "finished", "checked_at")
)


def _state(config: Workspace, version: str) -> StateFile:
    return StateFile(state_file(config, version), SCHEMA, what="release-check state")


def load_state(config: Workspace, version: str) -> BaseState | None:
    data = _state(config, version).load()
    if data is None:
        return None
    try:
        return BaseState.from_json(data)
    except (ValueError, KeyError, TypeError, AttributeError):
        log.warning("ignoring the unreadable release-check state %s", state_file(config, version))
        return None


def save_state(config: Workspace, state: BaseState) -> None:
    _state(config, state.version).save(state.to_json())


@dataclass
class Context:
    config: Workspace
    version: str
    state: BaseState
    torch: str
    out_dir: Path

    @property
    def tree(self) -> Path:
        return self.config.cache.work / f"release-check-{self.version}"


# --- the steps ---------------------------------------------------------------------


# One base's result file of `release-check --out-dir` (read by vllm_fork.release.merge).
KIND = "vllm-fork release-check result"
RESULT_SCHEMA = 1


def result_path(out_dir: Path, version: str) -> Path:
    return out_dir / f"{version}.json"


def result_json(state: BaseState, *, reused: bool, run_seconds: float) -> dict[str, Any]:
    """One base's result file: its state and how the run that wrote it went."""
    return {
        "kind": KIND,
        "schema": RESULT_SCHEMA,
        "base": state.version,
        "reused": reused,
        # seconds from the start of the run that wrote it to this base's end
        "run_seconds": round(run_seconds, 1),
        "state": state.to_json(),
    }


def write_result(out_dir: Path, state: BaseState, *, reused: bool, run_seconds: float) -> Path:
    path = result_path(out_dir, state.version)
    write_json_atomic(path, result_json(state, reused=reused, run_seconds=run_seconds))
    return path


def step_materialize(ctx: Context) -> dict[str, Any]:
    if not has_series(ctx.config, ctx.version):
        raise StepFailed(f"no series/{ctx.version}: create it with `vllm-fork update` or rebase")
    tree = ctx.tree
    if tree.exists():
        shutil.rmtree(tree)  # our own tree of an earlier, interrupted run
    result = materialize(ctx.config, ctx.version, tree, internal=True)
    ctx.state.tree = str(tree)
    return {"patches": result.applied, **_disagreements(ctx, tree)}


def _disagreements(ctx: Context, tree: Path) -> dict[str, Any]:
    """How many Python files upstream's sdist and upstream's wheel of this base
    disagree on (docs/build.md: the precompiled build ships the wheel's version),
    when the pinned wheel is in the cache; nothing is downloaded for this."""
    base = ctx.config.pins.get(ctx.version)
    if base.wheel is None:
        return {"sdist_wheel_disagree": None}
    cached = ctx.config.fetcher.cached_path(base.wheel)
    if not cached.is_file():
        return {"sdist_wheel_disagree": None}
    with Wheel(cached) as wheel:
        files = sorted(sdist_wheel_disagreements(tree, ctx.version, record_hashes(wheel)))
    return {"sdist_wheel_disagree": len(files), "sdist_wheel_files": files}


def _need_tree(ctx: Context) -> Path:
    tree = ctx.tree
    if not (tree / ".git").exists():
        # the tree of an interrupted run is gone: make it again (same inputs, same tree)
        step_materialize(ctx)
    return tree


def _tree_python(ctx: Context, tree: Path) -> str:
    return str(treevenv.ensure_tree_venv(ctx.config, tree, ctx.torch))


def pytest_args(tree: Path) -> list[str]:
    """The pytest arguments every run in ``tree`` gets (the ROCm simulation)."""
    return sim_plugin_args(tree)


def step_known_issues(ctx: Context) -> dict[str, Any]:
    """Each entry of the known-issue register on the materialized tree; a base
    with an AFFECTED entry fails."""
    tree = _need_tree(ctx)
    tag = tag_for(ctx.version)
    fixes = [(c.subject, c.values(FIXES_TRAILER)) for c in series_commits(tree, tag)]
    states = known_issue_states(
        ctx.config,  # type: ignore[arg-type]
        GitTree(ctx.config.upstream_repo, f"refs/tags/{tag}"),
        DirTree(tree),
        fixes,
    )
    data: dict[str, Any] = {"known_issues": {s.issue: s.to_json() for s in states}}
    # upstream's changes to this base's watched code that nobody has triaged yet
    untriaged = [c.id for c in untriaged_for_base(ctx.config, ctx.version)]  # type: ignore[arg-type]
    data["untriaged"] = untriaged
    bad = [s.issue for s in affected(states)]
    if bad:
        raise StepFailed(f"{AFFECTED} by known issue(s): {', '.join(bad)}", data)
    if untriaged:
        raise StepFailed(
            f"{len(untriaged)} upstream change(s) to the fork's code not triaged "
            f"(vllm-fork watch; {TRIAGE_FILE}): {', '.join(untriaged[:3])}"
            + (" ..." if len(untriaged) > 3 else ""),
            data,
        )
    return data


def step_tests(ctx: Context) -> dict[str, Any]:
    tree = _need_tree(ctx)
    outcome = run_fork_tests(tree, _tree_python(ctx, tree), pytest_args(tree))
    data = {
        "passed": outcome.passed,
        "failed": outcome.failed,
        "errors": outcome.errors,
        "skipped": outcome.skipped,
    }
    if not outcome.green:
        raise StepFailed(f"fork tests: {outcome.summary()}", data)
    return data


def step_prove_fail(ctx: Context) -> dict[str, Any]:
    tree = _need_tree(ctx)
    proofs = prove_failing(tree, _tree_python(ctx, tree), pytest_args(tree))
    judged = [p for p in proofs if p.counts]
    unproven = [f"{p.patch.subject}: {p.verdict}" for p in judged if not p.ok]
    data = {"proven": len(judged) - len(unproven), "total": len(judged), "unproven": unproven}
    if unproven:
        raise StepFailed(f"{len(unproven)} of {len(judged)} patch(es) not proven", data)
    return data


def step_wheel(ctx: Context) -> dict[str, Any]:
    if not has_series(ctx.config, ctx.version):
        raise StepFailed(f"no series/{ctx.version}")
    try:
        result = build(ctx.config, BuildRequest(base=ctx.version, out_dir=ctx.out_dir))
    except BuildRefused as exc:
        raise StepFailed(f"build refused: {exc}", {"built": False, "verified": False}) from exc
    release_files(ctx.config, result)
    # build() verifies the wheel and raises when it does not verify
    return {"wheel": str(result.wheel), "built": True, "verified": True}


def step_install(ctx: Context) -> dict[str, Any]:
    """pip installs the wheel alone (``--no-deps``) into a fresh venv; the installed
    files must carry the wheel's version, its provenance record and every change
    the series carries in Python files (``vllm-fork smoke`` without the import)."""
    wheel = Path(ctx.state.steps["wheel"]["wheel"])
    result = smoke(ctx.config, wheel, deps=False, import_vllm=False)
    if result.failures:
        raise StepFailed(
            f"installed wheel: {result.failures[0]}",
            {"installed": True, "failures": result.failures},
        )
    return {"installed": True, "checks": len(result.lines)}


def step_tool_tests(ctx: Context) -> dict[str, Any]:
    """The tool's release tests (``pytest -m release``), once, with the default base."""
    digest = sources_digest(ctx.config.root)
    outcome = run_release_tests(ctx.config.root)
    data = {
        "passed": outcome.passed,
        "failed": outcome.failed,
        "errors": outcome.errors,
        "skipped": outcome.skipped,
        "sources": digest,
    }
    if not outcome.green:
        raise StepFailed(f"the tool's release tests: {outcome.summary()}", data)
    return data


STEP_FUNCTIONS: dict[str, Step] = {
    "materialize": step_materialize,
    "known-issues": step_known_issues,
    "tests": step_tests,
    "prove-fail": step_prove_fail,
    "wheel": step_wheel,
    "install": step_install,
    TOOL_TESTS: step_tool_tests,
}


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else "(no message)"


def check_base(
    config: Workspace,
    pins: Pins,
    version: str,
    *,
    torch: str,
    wheel: bool = True,
    force: bool = False,
    out_dir: Path | None = None,
) -> tuple[BaseState, bool]:
    """Run (or resume) the check of one base; returns its state and whether
    the whole result was taken from an earlier run."""
    data = inputs(config, pins, version, torch, wheel)
    digest = inputs_digest(data)
    state = None if force else load_state(config, version)
    if state is not None and state.digest != digest:
        log.info("%s: inputs changed since the last check; checking again", version)
        state = None
    if state is not None and any(step.get("retry") for step in state.steps.values()):
        # a step crashed (a bug or a broken tool install, not a result): redo it
        # and the steps it kept from running
        state.steps = {
            name: step
            for name, step in state.steps.items()
            if not step.get("retry") and step.get("status") != NOT_RUN
        }
        state.finished = False
    default = version == pins.get(None).version
    steps = [
        s
        for s in STEPS
        if (wheel or s not in WHEEL_STEPS) and (default or s not in DEFAULT_BASE_STEPS)
    ]
    recorded = state.steps.get(TOOL_TESTS) if state is not None else None
    if (
        state is not None
        and recorded is not None
        and TOOL_TESTS in steps
        and recorded.get("sources") != sources_digest(config.root)
    ):
        log.info("%s: the tool's sources changed since its release tests ran", version)
        del state.steps[TOOL_TESTS]
        state.finished = False
    if state is not None and state.finished:
        if all(name in state.steps for name in steps):
            return state, True
        # recorded by a tool that had fewer steps: run the new ones only
        state.finished = False
    if state is None:
        state = BaseState(version=version, digest=digest, inputs=data)
        save_state(config, state)
    ctx = Context(config, version, state, torch, out_dir or state_dir(config) / "wheels" / version)
    for name in steps:
        if name in state.steps:
            log.info("%s: %s already recorded (%s)", version, name, state.steps[name]["status"])
            continue
        needed, missing = NEEDS.get(name, (None, ""))
        if needed is not None and state.steps.get(needed, {}).get("status") != OK:
            state.steps[name] = {"status": NOT_RUN, "reason": missing, "seconds": 0}
            save_state(config, state)
            continue
        log.info("%s: %s", version, name)
        t0 = time.monotonic()
        try:
            result = {"status": OK, **STEP_FUNCTIONS[name](ctx)}
        except StepFailed as exc:
            result = {"status": FAILED, "reason": _first_line(str(exc)), **exc.data}
        except ForkError as exc:
            result = {"status": FAILED, "reason": _first_line(str(exc))}
        except Exception as exc:  # a bug in one base's run must not stop the others
            log.exception("%s: %s crashed", version, name)
            result = {
                "status": FAILED,
                "reason": f"internal error: {type(exc).__name__}: {exc}",
                "retry": True,
            }
        result["seconds"] = round(time.monotonic() - t0, 1)
        state.steps[name] = result
        save_state(config, state)
    state.finished = True
    state.checked_at = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    save_state(config, state)
    if state.tree and Path(state.tree).exists():
        shutil.rmtree(state.tree, ignore_errors=True)
    return state, False


@dataclass
class Report:
    states: list[BaseState]
    reused: set[str]
    seconds: float
    # bases whose result a merge of per-base results lacks (release/merge.py)
    missing: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.missing and all(s.passed for s in self.states)

    def rows(self) -> list[dict[str, Any]]:
        return [summary(s, s.version in self.reused) for s in self.states]

    def to_json(self) -> dict[str, Any]:
        rows = self.rows()
        total: dict[str, float] = {
            key: sum(int(r[key] or 0) for r in rows)
            for key in ("passed", "failed", "skipped", "proven", "proven_of")
        }
        total["bases"] = len(rows)
        total["bases_passed"] = sum(r["result"] == OK for r in rows)
        total["wheels_verified"] = sum(bool(r["verified"]) for r in rows)
        total["wheels_installed"] = sum(bool(r["installed"]) for r in rows)
        total["seconds"] = round(sum(float(r["seconds"]) for r in rows), 1)
        total["run_seconds"] = round(self.seconds, 1)
        total["missing"] = len(self.missing)
        return {"bases": rows, "missing": list(self.missing), "total": total}


def summary(state: BaseState, reused: bool = False) -> dict[str, Any]:
    """One base's row of the summary table."""
    steps = state.steps
    tests = steps.get("tests", {})
    proof = steps.get("prove-fail", {})
    wheel = steps.get("wheel", {})
    install = steps.get("install", {})
    tool = steps.get(TOOL_TESTS)
    made = steps.get("materialize", {})
    issues = steps.get("known-issues", {}).get("known_issues")
    # in the order the steps run, whatever order the record keeps them in
    order = {name: i for i, name in enumerate(STEPS)}
    reasons = [
        f"{name}: {step['reason']}"
        for name, step in sorted(steps.items(), key=lambda item: order.get(item[0], len(order)))
        if step.get("status") != OK and step.get("reason")
    ]
    result = (OK if state.passed else FAILED) if state.finished else "incomplete"
    return {
        "base": state.version,
        "series": state.version if state.inputs.get("series") else None,
        "result": result,
        "passed": tests.get("passed"),
        "failed": tests["failed"] + tests.get("errors", 0) if "failed" in tests else None,
        "skipped": tests.get("skipped"),
        "proven": proof.get("proven"),
        "proven_of": proof.get("total"),
        "built": bool(wheel.get("built")) if wheel else None,
        "verified": bool(wheel.get("verified")) if wheel else None,
        "installed": install.get("status") == OK if install else None,
        "wheel": wheel.get("wheel"),
        "sdist_wheel_disagree": made.get("sdist_wheel_disagree"),
        "known_issues": None
        if issues is None
        else {issue: cell["state"] for issue, cell in sorted(issues.items())},
        "tool_tests": None
        if tool is None
        else {
            "result": tool.get("status"),
            **{k: tool.get(k) for k in ("passed", "failed", "errors", "skipped", "seconds")},
        },
        "seconds": round(state.seconds, 1),
        "reused": reused,
        "reasons": reasons,
    }


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if value is True:
        return "yes"
    if value is False:
        return "no"
    return str(value)


def issues_cell(states: dict[str, str] | None) -> str:
    """``none affected (N)``, or the AFFECTED entries; ``-`` when not checked."""
    if states is None:
        return "-"
    bad = [issue for issue, state in states.items() if state == AFFECTED]
    if bad:
        return f"{AFFECTED}: {', '.join(bad)}"
    return f"none affected ({len(states)})"


def _tool_tests_cell(tool: dict[str, Any]) -> str:
    counts = ", ".join(
        f"{_cell(tool.get(key))} {key}" for key in ("passed", "failed", "errors", "skipped")
    )
    return f"{tool.get('result')}: {counts} ({float(tool.get('seconds') or 0):.0f} s)"


def format_report(report: Report) -> str:
    data = report.to_json()
    lines = [
        "| base | known issues | tests passed | failed | skipped | prove-fail | wheel built "
        "| verified | installed | sdist/wheel disagree | time (s) | result |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in data["bases"]:
        proof = f"{r['proven']}/{r['proven_of']}" if r["proven_of"] is not None else "-"
        result = r["result"] + (" (recorded)" if r["reused"] else "")
        lines.append(
            f"| {r['base']} | {issues_cell(r.get('known_issues'))} "
            f"| {_cell(r['passed'])} | {_cell(r['failed'])} "
            f"| {_cell(r['skipped'])} | {proof} | {_cell(r['built'])} "
            f"| {_cell(r['verified'])} | {_cell(r['installed'])} "
            f"| {_cell(r['sdist_wheel_disagree'])} "
            f"| {r['seconds']:.0f} | {result} |"
        )
    for version in data["missing"]:
        lines.append(f"| {version} |{' - |' * 10} - | missing |")
    t = data["total"]
    expected = t["bases"] + t["missing"]
    missing = f", {t['missing']} missing" if t["missing"] else ""
    lines.append(
        f"| **total** ({t['bases_passed']}/{expected} ok{missing}) | | {t['passed']} "
        f"| {t['failed']} "
        f"| {t['skipped']} | {t['proven']}/{t['proven_of']} | | {t['wheels_verified']} "
        f"| {t['wheels_installed']} | | {t['seconds']:.0f} | |"
    )
    tool = [
        f"- with {r['base']}: {_tool_tests_cell(r['tool_tests'])}"
        for r in data["bases"]
        if r.get("tool_tests")
    ]
    if tool:
        lines += ["", "The tool's release tests (`pytest -m release`, step tool-tests):", "", *tool]
    notes = [f"- {r['base']}: {reason}" for r in data["bases"] for reason in r["reasons"]]
    notes += [f"- {version}: no result (missing)" for version in data["missing"]]
    if notes:
        lines += ["", "Reasons:", "", *notes]
    gpu = [f"- {line}" for r in data["bases"] if (line := last_gpu_run(r["base"]))]
    if gpu:
        lines += ["", "Last GPU run (committed results of `gpu-bundle`):", "", *gpu]
    return "\n".join(lines)


def write_report_files(
    report: Report, *, markdown: Path | None = None, json_file: Path | None = None
) -> None:
    """The report's table as Markdown and its JSON, each written whole or not at all."""
    if markdown is not None:
        write_bytes_atomic(markdown, f"# Release check\n\n{format_report(report)}\n".encode())
    if json_file is not None:
        write_json_atomic(json_file, report.to_json())


def parse_shard(text: str) -> tuple[int, int]:
    """``I/N`` (1 <= I <= N) as ``(I, N)``."""
    index, sep, count = text.partition("/")
    try:
        shard = (int(index), int(count))
    except ValueError:
        shard = (0, 0)
    if not sep or not 1 <= shard[0] <= shard[1]:
        raise UsageError(f"--shard {text}: expected I/N with 1 <= I <= N (e.g. 2/3)")
    return shard


def shard_bases(versions: Sequence[str], shard: tuple[int, int]) -> list[str]:
    """Shard I of N: every N-th base from the I-th, oldest first. The N shards
    together hold every base once, and their sizes differ by one at most."""
    index, count = shard
    return list(versions)[index - 1 :: count]


def release_check(
    config: Workspace,
    bases: Sequence[str] | None = None,
    *,
    torch: str | None = None,
    wheel: bool = True,
    force: bool = False,
    shard: tuple[int, int] | None = None,
    out_dir: Path | None = None,
) -> Report:
    """Check ``bases`` (default: every supported base and every base with a
    series), or shard I of N of them; with ``out_dir``, each base's result is
    also written to ``out_dir/<V>.json`` as soon as it is known (release/merge.py
    combines such files into one report)."""
    start = time.monotonic()
    pins = config.pins
    spec = torch_spec(torch)
    states: list[BaseState] = []
    reused: set[str] = set()
    selected = select_bases(config, pins, bases)
    if shard is not None:
        selected = shard_bases(selected, shard)
        log.info("shard %d/%d: %s", *shard, ", ".join(selected) or "no base")
    for version in selected:
        state, was_recorded = check_base(
            config, pins, version, torch=spec, wheel=wheel, force=force
        )
        states.append(state)
        if was_recorded:
            reused.add(version)
        if out_dir is not None:
            write_result(out_dir, state, reused=was_recorded, run_seconds=time.monotonic() - start)
        row = summary(state, was_recorded)
        log.info("%s: %s (%.0f s)", version, row["result"], row["seconds"])
    return Report(states, reused, time.monotonic() - start)


def ci_base(config: Workspace, commit: str) -> str | None:
    """The one extra base a CI run checks besides the default: picked from the
    commit hash among the other bases with a series, so successive commits
    exercise every base."""
    pins = config.pins
    default = pins.get(None).version
    others = [v for v in select_bases(config, pins, None) if v != default and has_series(config, v)]
    if not others:
        return None
    try:
        number = int(commit, 16)
    except ValueError:
        number = int(sha256_bytes(commit.encode()), 16)
    return others[number % len(others)]


def format_last_checks(config: Workspace, versions: Sequence[str]) -> str:
    """Per release: the series it has and the result of its last release check."""
    rows = last_checks(config)
    lines = [
        "| release | series | last release check | tests passed/failed/skipped "
        "| prove-fail | wheel verified | installed |",
        "|---|---|---|---|---|---|---|",
    ]
    for version in versions:
        series = f"series/{version}" if has_series(config, version) else "-"
        row = rows.get(version)
        if row is None:
            lines.append(f"| {version} | {series} | never | - | - | - | - |")
            continue
        stale = "" if row["current"] else " (inputs changed since)"
        tests = "/".join(_cell(row[k]) for k in ("passed", "failed", "skipped"))
        proof = f"{row['proven']}/{row['proven_of']}" if row["proven_of"] is not None else "-"
        lines.append(
            f"| {version} | {series} | {row['result']}{stale} at {row['checked_at'] or '?'} "
            f"| {tests} | {proof} | {_cell(row['verified'])} | {_cell(row.get('installed'))} |"
        )
    return "\n".join(lines)


def last_checks(config: Workspace) -> dict[str, dict[str, Any]]:
    """The summary row of every base's last recorded check (for ``matrix``)."""
    rows: dict[str, dict[str, Any]] = {}
    directory = state_dir(config)
    if not directory.is_dir():
        return rows
    for path in directory.glob("*.json"):
        state = load_state(config, path.stem)
        if state is not None:
            row = summary(state)
            row["checked_at"] = state.checked_at
            series = _series_digest(config, state.version)
            row["current"] = series == state.inputs.get("series") and (
                state.inputs.get("tool") == __version__
            )
            rows[state.version] = row
    return rows
