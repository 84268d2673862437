"""`vllm-fork update`: follow upstream to its newest release.

1. read the index (the vLLM files it lists) and pin every release newer
   than the newest one bases.toml pins (a release pinned earlier that has no
   series yet, newer than every series, is picked up again: that is how a
   stopped update goes on);
2. rebase the newest series onto the newest new release in a work tree of
   its own (3-way, absorbed patches dropped), which exports series/<NEW>;
3. run the fork tests and prove-fail in that tree;
4. report (Markdown and JSON): each patch applied as is, absorbed by
   upstream, or waiting for a maintainer, with the commands that go on.

Nothing is destroyed: a conflict leaves the rebase stopped in its tree (the
rebase's own state file knows how to continue or abort); a tree that exists
is never replaced.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from vllm_fork.atomic import write_bytes_atomic, write_json_atomic
from vllm_fork.errors import ExitCode, ForkError, OfflineError
from vllm_fork.rebase.engine import RebaseConflict, start_rebase
from vllm_fork.rebase.state import CONFLICT, load_state
from vllm_fork.release import check
from vllm_fork.release.check import has_series
from vllm_fork.sources.fetch import PROJECT, Fetcher
from vllm_fork.sources.pinner import pin_versions
from vllm_fork.sources.pins import Pins
from vllm_fork.sources.workspace import Workspace
from vllm_fork.testing import treevenv
from vllm_fork.testing.forktests import PROVEN, prove_failing, run_fork_tests
from vllm_fork.testing.treevenv import TreeVenvError
from vllm_fork.tree.apply import repo_of as find_git_dir

log = logging.getLogger(__name__)

SDIST_SUFFIX = ".tar.gz"
UP_TO_DATE = "up to date"
DONE = "rebased"
STOPPED = "needs a maintainer"
IN_PROGRESS = "rebase in progress"
VENV_PROBLEM = "the test venv could not be made:"


def index_releases(fetcher: Fetcher) -> list[Version]:
    """Final releases with an sdist on the configured indexes."""
    found: set[Version] = set()
    prefix = f"{PROJECT}-"
    for located in fetcher.project_files(PROJECT):
        name = located.package.filename
        if not (name.startswith(prefix) and name.endswith(SDIST_SUFFIX)):
            continue
        try:
            version = Version(name.removeprefix(prefix).removesuffix(SDIST_SUFFIX))
        except InvalidVersion:
            continue
        if not (version.is_prerelease or version.is_devrelease or version.local):
            found.add(version)
    return sorted(found)


def newest_series(config: Workspace, pins: Pins) -> str:
    with_series = [v for v in pins.versions() if has_series(config, v)]
    if not with_series:
        raise ForkError("no pinned base has a series to rebase")
    return with_series[-1]


@dataclass
class UpdateReport:
    status: str
    from_version: str | None = None
    onto_version: str | None = None
    pinned: list[str] = field(default_factory=list)
    tree: str | None = None
    patches: list[dict[str, str]] = field(default_factory=list)
    conflict: str | None = None
    tests: dict[str, Any] | None = None
    proofs: list[dict[str, Any]] = field(default_factory=list)
    next_steps: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return (
            ExitCode.OK
            if self.status in (UP_TO_DATE, DONE) and not self.problems
            else ExitCode.FAILED
        )

    def default_report_path(self, config: Workspace, suffix: str) -> Path:
        name = f"update-{self.onto_version}" if self.onto_version else "update"
        return config.root / "work" / f"{name}-report{suffix}"

    def write_files(
        self, config: Workspace, *, markdown: Path | None, json_file: Path | None
    ) -> tuple[Path, Path]:
        """The report as Markdown and JSON (default: beside the work tree, under
        ``work/``), each written whole or not at all; the two paths."""
        markdown = markdown or self.default_report_path(config, ".md")
        json_file = json_file or self.default_report_path(config, ".json")
        write_bytes_atomic(markdown, (format_update(self) + "\n").encode())
        write_json_atomic(json_file, self.to_json())
        return markdown, json_file

    def to_json(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "from": self.from_version,
            "onto": self.onto_version,
            "pinned": self.pinned,
            "tree": self.tree,
            "patches": self.patches,
            "conflict": self.conflict,
            "tests": self.tests,
            "proofs": self.proofs,
            "next_steps": self.next_steps,
            "problems": self.problems,
        }


def _picks(state: Any) -> list[dict[str, str]]:
    rows = []
    for i, pick in enumerate(state.picks):
        result = pick.result or "not yet replayed"
        if not pick.result and i == state.next and state.phase == CONFLICT:
            result = "conflict: needs a maintainer"
        rows.append(
            {
                "subject": pick.subject,
                "change": pick.change,
                "part": pick.part,
                "result": result,
                "detail": pick.detail,
            }
        )
    return rows


def _continue_steps(tree: Path, onto: str) -> list[str]:
    return [
        f"cd {tree}  # resolve the conflicted files, `git add` them",
        f"vllm-fork rebase --continue {tree}",
        f'vllm-fork rebase --skip --reason "WHY" {tree}  # instead: drop the patch',
        f"vllm-fork rebase --abort {tree}  # instead: put the tree back as before",
        f"vllm-fork update  # after the rebase finished: tests, prove-fail, report for {onto}",
    ]


def _after_steps(onto: str) -> list[str]:
    return [
        f"git add bases.toml series/{onto} && git commit -m 'series/{onto}: rebase'",
        f"vllm-fork pin {onto} --supported  # once it passes",
        f"vllm-fork release-check --bases {onto}",
    ]


def _finished_by_hand(config: Workspace, version: str, work_dir: Path | None) -> Path | None:
    """The update tree of ``version`` when its rebase stopped earlier and has
    finished since (its report still says it needs a maintainer)."""
    tree = (work_dir or config.root / "work" / f"update-{version}").absolute()
    report = config.root / "work" / f"update-{version}-report.json"
    if not (tree / ".git").exists() or not report.is_file():
        return None
    try:
        data = json.loads(report.read_text())
    except ValueError:
        return None
    untested = data.get("status") in (STOPPED, IN_PROGRESS) or any(
        str(p).startswith(VENV_PROBLEM) for p in data.get("problems", [])
    )
    if not untested or load_state(find_git_dir(tree)) is not None:
        return None
    return tree


def _target(config: Workspace, fetcher: Fetcher) -> tuple[str | None, list[str]]:
    """The release to rebase onto and the releases newly pinned."""
    pins = config.pins
    newest_pinned = Version(pins.versions()[-1])
    new = [str(v) for v in index_releases(fetcher) if v > newest_pinned]
    if new:
        log.info("new on the index: %s", ", ".join(new))
        pins = pin_versions(config, fetcher, new, supported=False, default=False)
    source = newest_series(config, pins)
    candidates = [v for v in pins.versions() if Version(v) > Version(source)]
    # the newest pinned release without a series: new now, or left by a stopped update
    return (candidates[-1] if candidates else None), new


def update(
    config: Workspace, *, work_dir: Path | None = None, torch: str | None = None
) -> UpdateReport:

    if config.offline:
        raise OfflineError("update reads the package index for new releases; it cannot run offline")
    onto, pinned = _target(config, config.fetcher)
    pins = config.pins
    source = newest_series(config, pins)
    if onto is None:
        finished = _finished_by_hand(config, source, work_dir)
        if finished is None:
            return UpdateReport(UP_TO_DATE, from_version=source, pinned=pinned)
        # series/<source> came out of a rebase this command stopped and a
        # maintainer finished: it has not been tested yet
        onto, tree = source, finished
        report = UpdateReport(DONE, onto_version=onto, pinned=pinned, tree=str(tree))
        _test(config, tree, torch, report)
        report.next_steps = _after_steps(onto)
        return report
    tree = (work_dir or config.root / "work" / f"update-{onto}").absolute()
    report = UpdateReport(
        IN_PROGRESS, from_version=source, onto_version=onto, pinned=pinned, tree=str(tree)
    )
    if tree.exists() and any(tree.iterdir()):
        # a tree left by an earlier update: never replaced; go on from what it says
        state = load_state(find_git_dir(tree)) if (tree / ".git").exists() else None
        if state is not None:
            report.patches = _picks(state)
            report.next_steps = _continue_steps(tree, onto)
            return report
        if not has_series(config, onto):
            report.status = STOPPED
            report.problems.append(
                f"{tree} exists without a rebase in progress and series/{onto} is missing; "
                "move it away or pass --dir"
            )
            return report
        report.status = DONE
    else:
        try:
            result = start_rebase(config, source, onto, tree, log=lambda line: log.info(line))
        except RebaseConflict as exc:
            state = load_state(find_git_dir(tree))
            report.status = STOPPED
            report.conflict = str(exc)
            report.patches = _picks(state) if state else []
            report.next_steps = _continue_steps(tree, onto)
            return report
        report.status = DONE
        report.patches = _picks(result.state)
    _test(config, tree, torch, report)
    report.next_steps = _after_steps(onto)
    return report


def progress(line: str) -> None:
    """A progress line of a long phase, on stderr (stdout carries the report)."""
    print(line, file=sys.stderr, flush=True)


def _test(config: Workspace, tree: Path, torch: str | None, report: UpdateReport) -> None:
    try:
        python = str(treevenv.ensure_tree_venv(config, tree, torch))
    except TreeVenvError as exc:  # the next update tries again
        report.problems.append(f"{VENV_PROBLEM} {exc}")
        return
    try:
        extra = check.pytest_args(tree)
        # pytest's own output would land in the report printed on stdout: lines on stderr
        progress(f"update: fork tests in {tree}")
        t0 = time.monotonic()
        outcome = run_fork_tests(tree, python, extra, quiet=True)
        progress(f"update: fork tests: {outcome.summary()} ({time.monotonic() - t0:.0f} s)")
        report.tests = {
            "passed": outcome.passed,
            "failed": outcome.failed,
            "errors": outcome.errors,
            "skipped": outcome.skipped,
        }
        if not outcome.green:
            report.problems.append(f"fork tests: {outcome.summary()}")
        proofs = prove_failing(tree, python, extra, log=progress)
    except ForkError as exc:
        report.problems.append(f"tests could not run: {exc}")
        return
    for proof in proofs:
        report.proofs.append(
            {
                "subject": proof.patch.subject,
                "part": proof.patch.part,
                "verdict": proof.verdict,
                "judged": proof.counts,
                "proven": proof.counts and proof.ok,
            }
        )
        if not proof.ok:
            report.problems.append(f"prove-fail: {proof.patch.subject}: {proof.verdict}")


def format_update(report: UpdateReport) -> str:
    lines = [f"# vllm-fork update: {report.status}", ""]
    if report.pinned:
        lines.append(f"Newly pinned: {', '.join(report.pinned)}")
    if report.onto_version is None:
        lines.append(f"No release newer than the newest series ({report.from_version}).")
        return "\n".join(lines)
    if report.from_version is None:
        lines.append(
            f"Tested series/{report.onto_version} (rebase finished by hand) in {report.tree}"
        )
    else:
        lines.append(
            f"Rebase: series/{report.from_version} onto {report.onto_version} in {report.tree}"
        )
    if report.patches:
        counts: dict[str, int] = {}
        for row in report.patches:
            key = row["result"].split(":")[0]
            counts[key] = counts.get(key, 0) + 1
        lines += ["", ", ".join(f"{n} {k}" for k, n in counts.items()), ""]
        lines += ["| patch | change | part | result |", "|---|---|---|---|"]
        for row in report.patches:
            detail = f" ({row['detail']})" if row["detail"] else ""
            lines.append(
                f"| {row['subject']} | {row['change']} | {row['part']} | {row['result']}{detail} |"
            )
    if report.conflict:
        lines += ["", "## Conflict", "", "```", report.conflict.strip(), "```"]
    if report.tests is not None:
        t = report.tests
        lines += [
            "",
            f"Fork tests: {t['passed']} passed, {t['failed']} failed, {t['errors']} errors, "
            f"{t['skipped']} skipped",
        ]
    if report.proofs:
        judged = [p for p in report.proofs if p.get("judged", True)]
        proven = [p for p in judged if p.get("proven", p["verdict"] == PROVEN)]
        lines.append(
            f"Prove-fail: {len(proven)} proven of {len(judged)} change/hardening patch(es)"
        )
        lines += [
            f"- not proven: {p['subject']} ({p['verdict']})" for p in judged if p not in proven
        ]
    if report.problems:
        lines += ["", "## Problems", "", *[f"- {p}" for p in report.problems]]
    if report.next_steps:
        lines += ["", "## Next", "", "```", *report.next_steps, "```"]
    return "\n".join(lines)
