"""`vllm-fork status`: where each change stands for a base and its series.

The series is applied without a work tree: upstream's tree is read into a
temporary index of the cached repository, each patch is applied with
``git apply --cached``, and ``git write-tree`` gives the tree the probes read.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm_fork.changes import registry
from vllm_fork.changes.state import CARRIED, MISSING, NA, UPSTREAM, decide
from vllm_fork.config import Config
from vllm_fork.errors import PatchFailedError, UsageError
from vllm_fork.git import git_env, git_out, run_git
from vllm_fork.probes import DirTree, Finding, GitTree, probe_all
from vllm_fork.series.patches import Series, load_series
from vllm_fork.sources.fetch import Fetcher
from vllm_fork.sources.pins import load_pins
from vllm_fork.sources.upstream import ensure_upstream, tag_for
from vllm_fork.tree.commits import series_commits, tree_base

__all__ = ["CARRIED", "MISSING", "NA", "UPSTREAM", "compute_status", "format_status"]


@dataclass(frozen=True)
class ChangeStatus:
    change: str
    state: str
    reason: str
    patches: tuple[str, ...]
    hardening: dict[str, bool]

    def to_json(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "reason": self.reason,
            "patches": list(self.patches),
            "hardening": dict(self.hardening),
        }


@dataclass(frozen=True)
class StatusReport:
    version: str
    patches: tuple[str, ...]
    changes: tuple[ChangeStatus, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "base": self.version,
            "series": list(self.patches),
            "changes": {c.change: c.to_json() for c in self.changes},
        }


def series_tree(repo: Path, tag: str, series: Series) -> str:
    """The tree id of ``tag`` with every patch of ``series`` applied (no checkout)."""
    with tempfile.TemporaryDirectory(prefix="vllm-fork-status-") as tmp:
        env = git_env(
            {"GIT_DIR": str(repo), "GIT_INDEX_FILE": os.path.join(tmp, "index")}, isolated=True
        )
        run_git(["read-tree", tag], env=env)
        for patch in series.patches:
            proc = run_git(["apply", "--cached", patch], env=env, cwd=Path(tmp), check=False)
            if proc.returncode != 0:
                detail = proc.stderr.decode(errors="replace").strip()
                raise PatchFailedError(f"patch {patch.name} does not apply to {tag}: {detail}")
        return git_out(["write-tree"], env=env)


def classify(
    pristine: Finding, patched: Finding, parts: list[str]
) -> tuple[str, str, dict[str, bool]]:
    """State of one change from its findings on the base and on base + series,
    and the parts of the patches that carry it."""
    state = decide(pristine.state, parts, patched=patched.state)
    if state == NA:
        return state, pristine.reason, {}
    reason = pristine.reason if state == UPSTREAM else patched.reason
    return state, reason, dict(patched.hardening)


def compute_status(config: Config, version: str | None, tree: Path | None = None) -> StatusReport:
    """Status of base + series, or of a materialized work tree on disk (``tree``)."""
    if tree is not None:
        recorded = tree_base(tree)
        if version is not None and version != recorded:
            raise UsageError(f"{tree} is a work tree of {recorded}, not {version}")
        version = recorded
    base = load_pins(config.bases_file).get(version)
    series = load_series(config.series_dir(base.version))
    tag = ensure_upstream(config, base, Fetcher(config))
    repo = config.upstream_repo
    pristine = probe_all(GitTree(repo, tag))
    if tree is not None:
        patched = probe_all(DirTree(tree))
        commits = series_commits(tree, tag)
        names = tuple(c.subject for c in commits)
        # (name, change, part) of each patch, as committed in the tree
        patches = [(c.subject, ch, c.part) for c in commits for ch in c.values("Fork-Change")]
    else:
        patched = (
            probe_all(GitTree(repo, series_tree(repo, tag, series))) if series.patches else pristine
        )
        names = tuple(p.name for p in series.patches)
        patches = [
            (p.name, h.change, h.part) for p, h in zip(series.patches, series.headers, strict=True)
        ]
    changes = []
    for change in registry.change_ids():
        mine = [(name, part) for name, c, part in patches if c == change]
        state, reason, hardening = classify(
            pristine[change], patched[change], [part for _, part in mine]
        )
        changes.append(
            ChangeStatus(change, state, reason, tuple(name for name, _ in mine), hardening)
        )
    return StatusReport(base.version, names, tuple(changes))


def format_status(report: StatusReport) -> str:
    lines = [f"vLLM {report.version} + {len(report.patches)} patch(es) ({tag_for(report.version)})"]
    width = max(len(c.change) for c in report.changes) if report.changes else 0
    for c in report.changes:
        line = f"  {c.change:<{width}}  {c.state:<8}  {c.reason}"
        if c.hardening:
            done = sum(c.hardening.values())
            line += f" [hardening {done}/{len(c.hardening)}]"
        lines.append(line)
        for patch in c.patches:
            lines.append(f"  {'':<{width}}  {'':<8}  <- {patch}")
    return "\n".join(lines)
