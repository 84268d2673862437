"""`vllm-fork audit WHEEL`: every byte that differs from upstream's wheel is explained.

The hardened wheel is compared with upstream's wheel of the same version (the
one bases.toml pins, which a precompiled build reuses) through both wheels'
RECORD hashes: nothing is unpacked. Each member that was added, removed or
changed must be explained by one of:

- a file a series patch changes (named with the patch and its change id),
  whose bytes equal that file in the tree materialized from the pinned sdist
  plus the series (the ``fork`` branch of such a tree: an edit made in a
  build tree after materialize is not in it, so it is caught);
- the fork's own metadata: the provenance record, the version string in
  ``vllm/_version.py``, ``METADATA``, ``WHEEL`` and ``RECORD``;
- in a full build only, a compiled member: "rebuilt, with patch P" when a
  patch changes compiled sources, else "rebuilt by the full build" (never
  called explained by a patch).

Anything else fails, listed. Upstream's own sdist and wheel may disagree
(0.21.0's wheel was built from newer DeepSeek-V4 sources than its sdist):
:func:`sdist_wheel_disagreements` lists those files, and the precompiled
build follows one policy for them (docs/build.md, "Upstream's sdist and
wheel"): upstream's wheel version of files the series does not touch is
shipped, so that Python and binaries come from one source, and a patch of a
file on which the two disagree is refused.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vllm_fork.errors import ForkError
from vllm_fork.facts.names import tag_for
from vllm_fork.git import run_git
from vllm_fork.sources.pins import Base, FilePin
from vllm_fork.sources.rocm import ensure_rocm_wheel
from vllm_fork.sources.workspace import Workspace
from vllm_fork.tree.commits import series_commits
from vllm_fork.tree.materialize import BRANCH, materialize
from vllm_fork.wheel.provenance import (
    PACKAGE_PATH,
    Provenance,
    ProvenanceError,
    from_wheel,
    left_out_files,
)
from vllm_fork.wheel.wheelfile import Wheel, format_findings, record_digest

log = logging.getLogger(__name__)

DIST_INFO = "{dist-info}"
VERSION_PY = "vllm/_version.py"
# Members the fork writes itself, with why they differ from upstream's.
FORK_METADATA = {
    PACKAGE_PATH: "fork metadata: the provenance record",
    VERSION_PY: "fork metadata: the version string",
    f"{DIST_INFO}/METADATA": "fork metadata: the version in METADATA",
    f"{DIST_INFO}/WHEEL": "fork metadata: the wheel generator and tags",
    f"{DIST_INFO}/RECORD": "fork metadata: RECORD lists the fork's hashes",
}
COMPILED_SUFFIXES = (".so", ".pyd")
# Sources compiled into the binaries: a patch touching them needs a full build.
COMPILED_SOURCES = ("csrc/", "cmake/", "CMakeLists.txt")


class AuditError(ForkError):
    """The audit cannot run (no upstream wheel, no provenance, ...)."""


class NoBaselineError(AuditError):
    """bases.toml pins no upstream wheel for the base: nothing to compare with."""


@dataclass(frozen=True)
class Member:
    """One wheel member that differs from upstream's, and what explains it."""

    path: str
    state: str  # "added", "removed" or "changed"
    explanation: str | None  # None: nothing explains it
    detail: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "state": self.state,
            "explained": self.explanation is not None,
            "explanation": self.explanation,
            "detail": self.detail,
        }


@dataclass
class AuditReport:
    wheel: str
    upstream_wheel: str
    mode: str
    compared: int = 0
    members: list[Member] = field(default_factory=list)
    # files upstream's sdist and wheel disagree on, with what the fork wheel ships
    disagreements: list[tuple[str, str]] = field(default_factory=list)
    # findings about the wheel itself (RECORD, member names and types, bombs): with
    # any, RECORD's hashes cannot be trusted and nothing is compared
    problems: list[str] = field(default_factory=list)

    @property
    def unexplained(self) -> list[Member]:
        return [m for m in self.members if m.explanation is None]

    @property
    def passed(self) -> bool:
        return not self.unexplained and not self.problems

    def to_json(self) -> dict[str, Any]:
        return {
            "wheel": self.wheel,
            "upstream_wheel": self.upstream_wheel,
            "mode": self.mode,
            "compared": self.compared,
            "differing": len(self.members),
            "unexplained": len(self.unexplained),
            "members": [m.to_json() for m in self.members],
            "sdist_wheel_disagreements": [
                {"path": p, "fork_ships": ships} for p, ships in self.disagreements
            ],
            "problems": self.problems,
            "passed": self.passed,
        }

    def format(self) -> str:
        if self.problems:
            lines = [
                f"audit of {self.wheel}: {len(self.problems)} finding(s) in the wheel itself; "
                "not compared with upstream's wheel"
            ]
            lines += [f"  BAD      {p}" for p in self.problems]
            lines.append(f"audit: FAILED ({len(self.problems)} findings)")
            return "\n".join(lines)
        lines = [
            f"audit of {self.wheel} against {self.upstream_wheel} ({self.mode} build): "
            f"{self.compared} members compared, {len(self.members)} differ"
        ]
        for m in self.members:
            why = m.explanation or f"UNEXPLAINED{': ' + m.detail if m.detail else ''}"
            lines.append(f"  {m.state:8} {m.path}  <- {why}")
        if self.disagreements:
            lines.append(
                f"upstream's sdist and wheel disagree on {len(self.disagreements)} file(s):"
            )
            for path, ships in self.disagreements:
                lines.append(f"  {path}: the fork wheel ships {ships}")
        verdict = "passed" if self.passed else f"FAILED ({len(self.unexplained)} unexplained)"
        lines.append(f"audit: {verdict}")
        return "\n".join(lines)


def record_hashes(wheel: Wheel) -> dict[str, str]:
    """RECORD's ``sha256=...`` per member, the .dist-info folder written as {dist-info}
    (the rows that are valid; :meth:`Wheel.check` reports the others)."""
    out: dict[str, str] = {}
    for path, digest in wheel.record_hashes().items():
        if path.startswith(wheel.dist_info + "/"):
            path = DIST_INFO + path[len(wheel.dist_info) :]
        out[path] = digest
    return out


def _blobs(tree: Path, rev: str, paths: Iterable[str]) -> dict[str, bytes]:
    """The bytes of ``paths`` at ``rev`` in the git tree (absent paths are left out)."""
    wanted = sorted(set(paths))
    if not wanted:
        return {}
    request = "".join(f"{rev}:{p}\n" for p in wanted).encode()
    out = run_git(["cat-file", "--batch"], cwd=tree, input=request).stdout
    found: dict[str, bytes] = {}
    pos = 0
    for path in wanted:
        end = out.index(b"\n", pos)
        header = out[pos:end].split()
        pos = end + 1
        if header[-1] == b"missing":
            continue
        size = int(header[2])
        found[path] = out[pos : pos + size]
        pos += size + 1
    return found


def _tree_paths(tree: Path, rev: str, prefix: str) -> list[str]:
    out = run_git(["ls-tree", "-r", "--name-only", "-z", rev, "--", prefix], cwd=tree).stdout
    return [p for p in out.decode().split("\0") if p]


def sdist_wheel_disagreements(
    tree: Path, version: str, upstream: dict[str, str]
) -> dict[str, bytes]:
    """Python files of upstream's wheel whose bytes differ from upstream's sdist.

    ``upstream`` is the upstream wheel's RECORD hashes; the sdist is the
    ``upstream/<V>`` commit of ``tree``. Returns the sdist bytes of each such
    file (files only one side has are not disagreements: the wheel's
    packaging decides what it holds).
    """
    tag = tag_for(version)
    candidates = [
        p
        for p in upstream
        if p.startswith("vllm/") and p.endswith(".py") and p not in FORK_METADATA
    ]
    sdist = _blobs(tree, tag, candidates)
    return {p: data for p, data in sdist.items() if record_digest(data) != upstream[p]}


def _patched_paths(
    tree: Path, version: str, config: Workspace, left_out: Collection[str] = ()
) -> dict[str, list[str]]:
    """Tree path -> ["<patch file> (<change>)", ...] for every path the series changes
    (less the patches the build left out, as its provenance record lists them)."""
    series = config.series(version).without(left_out)
    commits = series_commits(tree)
    if len(commits) != len(series.patches):
        raise AuditError(
            f"{tree} has {len(commits)} series commit(s), series/{version} has "
            f"{len(series.patches)} patch(es)"
            + (f" less {len(left_out)} left out" if left_out else "")
            + ": not a materialization of the current series"
        )
    out: dict[str, list[str]] = {}
    for patch, commit in zip(series.patches, commits, strict=True):
        for path in commit.paths():
            out.setdefault(path, []).append(f"{patch.name} ({commit.change or 'no change id'})")
    return out


def _explain(
    path: str,
    state: str,
    fork_digest: str | None,
    patched: dict[str, list[str]],
    expected: dict[str, bytes],
    mode: str,
) -> Member:
    if path in FORK_METADATA:
        return Member(path, state, FORK_METADATA[path])
    if path in patched:
        by = ", ".join(patched[path])
        want = expected.get(path)
        if want is None and fork_digest is None:
            return Member(path, state, f"removed by {by}")
        if want is not None and fork_digest == record_digest(want):
            return Member(path, state, f"patched by {by}")
        return Member(
            path,
            state,
            None,
            f"changed by {by}, but its bytes differ from the tree materialized from the "
            "sdist plus the series",
        )
    if path.endswith(COMPILED_SUFFIXES) and mode == "empty" and state == "removed":
        return Member(path, state, "empty (pure Python) build: no compiled members")
    if path.endswith(COMPILED_SUFFIXES) and mode == "full":
        compiled = sorted(
            {
                name
                for p, names in patched.items()
                if p.startswith(COMPILED_SOURCES)
                for name in names
            }
        )
        if compiled:
            return Member(path, state, f"rebuilt, with {', '.join(compiled)}")
        return Member(path, state, "rebuilt by the full build (no patch changes its sources)")
    return Member(path, state, None, "no series patch changes this file")


def audit_wheel(
    config: Workspace, wheel_path: Path, *, tree: Path | None = None, checked: bool = False
) -> AuditReport:
    """Compare ``wheel_path`` with upstream's wheel; ``tree``: a materialized tree to reuse.

    The wheel is checked first (:meth:`Wheel.check`; ``checked``: the caller did): a
    wheel with findings gets a failed report listing them, and is not compared.
    """
    wheel_path = Path(wheel_path)
    with Wheel(wheel_path) as wheel:
        problems = [] if checked else wheel.check()
        try:
            record = from_wheel(wheel)
        except ProvenanceError as exc:
            if not problems:
                raise AuditError(str(exc)) from None
            problems.append(str(exc))
            record = None
        if problems:
            mode = record["build"]["mode"] if record else "unknown"
            return AuditReport(wheel_path.name, "-", mode, problems=format_findings(problems))
        assert record is not None
        version = record["base"]["version"]
        mode = record["build"]["mode"]
        parsed = Provenance.from_json(record)
        left_out = left_out_files(parsed)
        fork = record_hashes(wheel)
    try:
        base = config.base(version)
    except ForkError as exc:
        raise AuditError(
            f"{wheel_path.name}: its provenance names base {version}, which cannot be used: {exc}"
        ) from None
    upstream_path = _upstream_wheel(config, base, rocm_variant=_rocm_variant(parsed))
    with Wheel(upstream_path) as up:
        upstream = record_hashes(up)
    if tree is not None:
        return _audit(
            config, wheel_path, upstream_path, mode, fork, upstream, tree, version, left_out
        )

    config.cache.work.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="audit-", dir=config.cache.work) as tmp:
        scratch = Path(tmp) / "tree"
        log.info(
            f"materializing vLLM {version} + series"
            + (f" less {', '.join(left_out)}" if left_out else "")
            + f" to audit {wheel_path.name}"
        )
        materialize(config, version, scratch, internal=True, exclude=left_out)
        return _audit(
            config, wheel_path, upstream_path, mode, fork, upstream, scratch, version, left_out
        )


def _rocm_variant(record: Provenance) -> str | None:
    """The ROCm variant whose pinned upstream wheel a precompiled ROCm build reused."""
    if record.mode == "precompiled" and record.device == "rocm":
        if record.rocm is None:
            raise AuditError("a precompiled ROCm build's record names no ROCm variant")
        return record.rocm.variant
    return None


def _upstream_wheel(
    config: Workspace,
    base: Base,
    upstream: FilePin | None = None,
    *,
    rocm_variant: str | None = None,
) -> Path:
    """The verified upstream wheel to compare with: ``upstream`` when given, the pinned
    ROCm wheel of ``rocm_variant``, else the base's pinned (CUDA) wheel."""
    if rocm_variant is not None:
        return ensure_rocm_wheel(config, base.rocm_pin(rocm_variant), fetcher=config.fetcher)
    if upstream is not None:
        return config.fetcher.ensure(upstream)
    if base.wheel is None:
        raise NoBaselineError(
            f"bases.toml pins no upstream wheel for {base.version}: nothing to audit against"
        )
    return config.fetcher.ensure(base.wheel)


def _audit(
    config: Workspace,
    wheel_path: Path,
    upstream_path: Path,
    mode: str,
    fork: dict[str, str],
    upstream: dict[str, str],
    tree: Path,
    version: str,
    left_out: Collection[str] = (),
) -> AuditReport:

    patched = _patched_paths(tree, version, config, left_out)
    expected = _blobs(tree, BRANCH, patched)
    report = AuditReport(wheel_path.name, upstream_path.name, mode)
    report.compared = len(set(fork) | set(upstream))
    for path in sorted(set(fork) | set(upstream)):
        mine, theirs = fork.get(path), upstream.get(path)
        if mine == theirs:
            continue
        state = "added" if theirs is None else "removed" if mine is None else "changed"
        report.members.append(_explain(path, state, mine, patched, expected, mode))
    for path, sdist in sorted(sdist_wheel_disagreements(tree, version, upstream).items()):
        mine = fork.get(path)
        ships = (
            "upstream wheel's version"
            if mine == upstream[path]
            else "the sdist's version"
            if mine == record_digest(sdist)
            else "a third version"
        )
        report.disagreements.append((path, ships))
    return report


def align_with_upstream_wheel(
    config: Workspace,
    tree: Path,
    base: Base,
    *,
    left_out: Collection[str] = (),
    upstream: FilePin | None = None,
) -> list[str]:
    """The precompiled build's policy for files upstream's sdist and wheel disagree on.

    Upstream's wheel version of each such file replaces the sdist version in
    ``tree`` (staged in git, for setuptools-scm), so that the wheel's Python
    matches the binaries it reuses. A series patch of such a file is refused:
    it was written against sources that upstream's binaries were not built
    from. Returns the replaced paths. ``upstream``: the wheel the build reuses (the
    pinned ROCm wheel of a ROCm build; default the base's pinned wheel).
    """
    upstream_path = _upstream_wheel(config, base, upstream)
    with Wheel(upstream_path) as up:
        hashes = record_hashes(up)
        disagree = sdist_wheel_disagreements(tree, base.version, hashes)
        patched = _patched_paths(tree, base.version, config, left_out)
        touched = sorted(p for p in disagree if p in patched)
        if touched:
            raise AuditError(
                f"upstream's {base.version} sdist and wheel disagree on "
                + ", ".join(f"{p} (changed by {', '.join(patched[p])})" for p in touched)
                + ": the patch was written against sources that upstream's binaries were not "
                "built from; rebase it onto the wheel's version or build with --mode full"
            )
        for path in sorted(disagree):
            (tree / path).write_bytes(up.read(path))
    if disagree:
        run_git(["add", "--", *sorted(disagree)], cwd=tree)
        log.info(
            f"shipping upstream wheel's version of {len(disagree)} file(s) its sdist disagrees "
            f"on: {', '.join(sorted(disagree))}"
        )
    return sorted(disagree)
