"""The upstream watch: every change upstream made to the code the fork's
patches touch or its register probes, after each supported base.

The Linux stable process treats every upstream commit that fixes code in a
stable tree as a candidate to triage; this is that list for the fork:

- **What is watched (vLLM).** Per base, the functions its series' patches
  change (each hunk's lines mapped to the outermost function holding them,
  in the tree the patch applies to) and the functions the known-issue
  register's probes read (a clause's ``function``, else every function where
  its ``match`` holds); a non-Python file is watched whole. Nothing is
  configured: a new patch or register entry is watched as soon as it exists.
- **vLLM candidates.** For each pair of consecutive pinned releases (the
  imported sdists in the cache), every watched function whose code differs
  (comments and layout ignored). With ``vllm_repo`` (a clone of upstream's
  repository) also every commit after the newest release that changes one.
- **AITER candidates.** With ``aiter_repo`` (a clone of ROCm/aiter), every
  commit of a later tag or the main line that touches the AITER paths the
  fork's code reaches (``[watch].aiter_paths`` of the triage file) and that
  the AITER tag a base pins (``docker/Dockerfile.rocm_base``) lacks.
- Each candidate is shown once, with the bases it concerns, and its decision
  from the triage file (``upstream-triage.toml``): untriaged ones are what is
  left to do.

Everything is read from the cache and the given clones: no network, unless
``fetch`` imports bases missing from the cache or a URL is given.
"""

from __future__ import annotations

import fnmatch
import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from vllm_fork.atomic import write_json_atomic
from vllm_fork.diffs import parse_diff
from vllm_fork.errors import ForkError, UsageError
from vllm_fork.facts.known_issues import AllOf, Clause, KnownIssue
from vllm_fork.facts.names import tag_for
from vllm_fork.facts.triage import TRIAGE_FILE, AiterWatch, Decision, Triage, load_triage
from vllm_fork.git import git_env, git_out, run_git
from vllm_fork.probes.pyast import MODULE, WHOLE_FILE, unit_at, unit_digests, unit_spans
from vllm_fork.probes.rocm_pins import aiter_pin
from vllm_fork.series.patches import Series
from vllm_fork.sources.upstream import ensure_upstream, imported_sha256
from vllm_fork.sources.workspace import Workspace
from vllm_fork.sourcetree import GitTree, SourceTree
from vllm_fork.tree.apply import applier, tree_of

log = logging.getLogger(__name__)

VLLM = "vllm"
AITER = "aiter"
SCHEMA = 1


@dataclass(frozen=True, order=True)
class Unit:
    """A watched piece of upstream code: a function of a Python file, or a whole file."""

    path: str
    name: str = WHOLE_FILE

    def __str__(self) -> str:
        return self.path if self.name == WHOLE_FILE else f"{self.path}:{self.name}"


@dataclass
class Candidate:
    id: str  # "vllm/<A>..<B>/<unit>", "vllm/<sha12>/<unit>" or "aiter/<sha12>"
    source: str  # VLLM or AITER
    summary: str  # one line: what changed
    bases: tuple[str, ...]  # the supported bases it concerns (oldest first)
    decision: Decision | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "source": self.source,
            "summary": self.summary,
            "bases": list(self.bases),
            "decision": None
            if self.decision is None
            else {"kind": self.decision.kind, "text": self.decision.text},
        }


@dataclass
class WatchReport:
    bases: list[str]
    candidates: list[Candidate]
    read: list[str] = field(default_factory=list)  # what was read, one line each
    not_covered: list[str] = field(default_factory=list)  # what could not be watched, and why
    stale: list[str] = field(default_factory=list)  # triaged ids no candidate has now
    aiter: dict[str, str | None] = field(default_factory=dict)  # base -> its AITER pin

    @property
    def untriaged(self) -> list[Candidate]:
        return [c for c in self.candidates if c.decision is None]

    def per_base(self) -> dict[str, tuple[int, int]]:
        """Base -> (candidates, untriaged) that concern it."""
        out = {v: [0, 0] for v in self.bases}
        for c in self.candidates:
            for v in c.bases:
                out[v][0] += 1
                out[v][1] += c.decision is None
        return {v: (n, u) for v, (n, u) in out.items()}

    @property
    def ok(self) -> bool:
        return not self.untriaged and not self.not_covered

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "bases": self.bases,
            "aiter": self.aiter,
            "read": self.read,
            "not_covered": self.not_covered,
            "per_base": {
                v: {"candidates": n, "untriaged": u} for v, (n, u) in self.per_base().items()
            },
            "candidates": [c.to_json() for c in self.candidates],
            "stale_triage": self.stale,
        }


# --- what is watched ------------------------------------------------------------


def _is_python(path: str) -> bool:
    return path.endswith(".py")


def _changed_old_lines(hunk: Any) -> set[int]:
    """The lines of the old file a hunk changes: removed lines, and the line an
    addition follows (or precedes, at the top)."""
    lines: set[int] = set()
    previous: int | None = None
    pending_add = False
    for line in hunk:
        if line.is_removed:
            lines.add(line.source_line_no)
        elif line.is_added:
            if previous is not None:
                lines.add(previous)
            else:
                pending_add = True
        if line.source_line_no is not None:
            if pending_add and not line.is_removed:
                lines.add(line.source_line_no)
                pending_add = False
            previous = line.source_line_no
    return lines


def patch_units(before: SourceTree, patch_text: str, name: str = "patch") -> set[Unit]:
    """The upstream units one patch changes, read in ``before`` (the tree it
    applies to). Files the patch creates are the fork's own and not watched;
    a Python hunk outside every function and class (imports, constants) is
    not watched."""
    units: set[Unit] = set()
    for patched in parse_diff(patch_text, name):
        if patched.is_added_file:
            continue
        path = patched.source_file.removeprefix("a/")
        if not _is_python(path):
            units.add(Unit(path))
            continue
        text = before.read_text(path)
        if text is None:
            continue
        spans = unit_spans(text)
        for hunk in patched:
            for line in _changed_old_lines(hunk):
                unit = unit_at(spans, line)
                if unit != MODULE:
                    units.add(Unit(path, unit))
    return units


def series_units(repo: Path, tag: str, series: Series) -> tuple[set[Unit], str]:
    """Every upstream unit the patches of ``series`` change on ``tag``, and the
    tree of ``tag`` with the series applied."""
    trees = [tree_of(repo, tag)]
    if series.patches:
        with applier(repo, prefix="vllm-fork-watch-") as work:
            trees += work.series(tag, list(series.patches))
    units: set[Unit] = set()
    for before, patch in zip(trees, series.patches, strict=False):
        text = patch.read_text(encoding="utf-8", errors="replace")
        units |= patch_units(GitTree(repo, before), text, patch.name)
    return units, trees[-1]


def _clauses(issue: KnownIssue) -> Iterable[Clause]:
    for probe in (issue.affected, issue.fixed, issue.mitigated):
        if probe is None:
            continue
        for alternative in probe.clauses:
            inner = alternative.clauses if isinstance(alternative, AllOf) else (alternative,)
            # an AITER-pin clause reads the pin, a fact of the base (no code to watch)
            yield from (c for c in inner if isinstance(c, Clause))


def clause_units(tree: SourceTree, clause: Clause) -> set[Unit]:
    """The units a register clause reads in ``tree``: its function, else every
    function, class or module part where one of its patterns matches (the
    whole file when the file is not Python)."""
    path = next((p for p in clause.files if tree.read_text(p) is not None), None)
    if path is None:
        return set()
    if not _is_python(path):
        return {Unit(path)}
    text = tree.read_text(path) or ""
    spans = unit_spans(text)
    if clause.function is not None:
        return {
            Unit(path, name) for name, _, _ in spans if name.rsplit(".", 1)[-1] == clause.function
        }
    units: set[Unit] = set()
    starts = _line_starts(text)
    for pattern in clause.match:
        for found in pattern.finditer(text):
            line = _line_of(starts, found.start())
            units.add(Unit(path, unit_at(spans, line)))
    return units


def _line_starts(text: str) -> list[int]:
    return [0] + [i + 1 for i, ch in enumerate(text) if ch == "\n"]


def _line_of(starts: list[int], offset: int) -> int:
    lo, hi = 0, len(starts) - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if starts[mid] <= offset:
            lo = mid
        else:
            hi = mid - 1
    return lo + 1


def register_units(tree: SourceTree, issues: Sequence[KnownIssue]) -> set[Unit]:
    units: set[Unit] = set()
    for issue in issues:
        for clause in _clauses(issue):
            units |= clause_units(tree, clause)
    return units


def watched_units(config: Workspace, version: str) -> tuple[set[Unit], GitTree]:
    """Every unit watched on base ``version`` (its series and the register), and
    the fork's tree of the base."""
    repo = config.upstream_repo
    tag = tag_for(version)
    units, patched = series_units(repo, tag, config.series(version))
    return units | register_units(GitTree(repo, tag), config.known_issues), GitTree(repo, patched)


# --- vLLM candidates ------------------------------------------------------------


def renames(repo: Path, old: str, new: str) -> dict[str, str]:
    """Files of ``old`` that ``new`` has under another path (git's rename detection)."""
    out = git_out(
        ["diff", "--name-status", "-z", "-M", "--diff-filter=R", old, new],
        env=git_env({"GIT_DIR": str(repo)}),
    )
    fields = [f for f in out.split("\0") if f]
    moved: dict[str, str] = {}
    for i in range(0, len(fields) - 2, 3):
        moved[fields[i + 1]] = fields[i + 2]
    return moved


class _Digests:
    """Unit digests of the files of a repository's revisions, each file read once."""

    def __init__(self, repo: Path) -> None:
        self.repo = repo
        self._trees: dict[str, GitTree] = {}
        self._files: dict[tuple[str, str], dict[str, str] | None] = {}

    def tree(self, rev: str) -> GitTree:
        if rev not in self._trees:
            self._trees[rev] = GitTree(self.repo, rev)
        return self._trees[rev]

    def of(self, rev: str, unit: Unit) -> str | None:
        """The unit's code at ``rev`` (None: absent)."""
        key = (rev, unit.path)
        if key not in self._files:
            text = self.tree(rev).read_text(unit.path)
            if text is None:
                self._files[key] = None
            elif _is_python(unit.path):
                self._files[key] = {WHOLE_FILE: text, **unit_digests(text)}
            else:
                self._files[key] = {WHOLE_FILE: text}
        found = self._files[key]
        return None if found is None else found.get(unit.name)


def _verb(before: str | None, after: str | None) -> str:
    if before is None:
        return "added"
    if after is None:
        return "removed"
    return "changed"


def release_candidates(
    repo: Path, versions: Sequence[str], watched: Mapping[str, set[Unit]]
) -> list[Candidate]:
    """Changes to watched units between consecutive releases of ``versions``
    (oldest first, all imported). A change from A to B concerns every base up
    to A that watches the unit."""
    digests = _Digests(repo)
    out: list[Candidate] = []
    for i in range(len(versions) - 1):
        old, new = versions[i], versions[i + 1]
        older = versions[: i + 1]
        units = sorted(set().union(*(watched.get(v, set()) for v in older)))
        moved = renames(repo, tag_for(old), tag_for(new))
        for unit in units:
            before = digests.of(tag_for(old), unit)
            after_unit = Unit(moved.get(unit.path, unit.path), unit.name)
            after = digests.of(tag_for(new), after_unit)
            if before == after or (before is None and after is None):
                continue
            bases = tuple(v for v in older if unit in watched.get(v, set()))
            where = "" if after_unit == unit else f" (now {after_unit})"
            out.append(
                Candidate(
                    id=f"{VLLM}/{old}..{new}/{unit}",
                    source=VLLM,
                    summary=f"{unit} {_verb(before, after)} in {new}{where}",
                    bases=bases,
                )
            )
    return out


def _touched(
    repo: Path, revs: Sequence[str], paths: Sequence[str]
) -> list[tuple[str, str, list[str]]]:
    """(sha, subject, files) of the non-merge commits of ``revs`` touching ``paths``."""
    out = git_out(
        [
            "log",
            "--no-merges",
            "--reverse",
            "--name-only",
            "--format=%x01%H%x00%s",
            *revs,
            "--",
            *paths,
        ],
        env=git_env({"GIT_DIR": str(repo)}),
    )
    rows = []
    for block in out.split("\x01")[1:]:
        head, _, files = block.partition("\n")
        sha, _, subject = head.partition("\0")
        rows.append((sha, subject, [f for f in files.splitlines() if f]))
    return rows


def repo_candidates(
    repo: Path, since: str, watched: Mapping[str, set[Unit]], versions: Sequence[str]
) -> list[Candidate]:
    """Commits of upstream's repository after ``since`` (the newest release)
    that change a unit watched on some base; they concern every base watching it."""
    union = sorted(set().union(*watched.values())) if watched else []
    paths = sorted({u.path for u in union})
    if not paths:
        return []
    digests = _Digests(repo)
    out: list[Candidate] = []
    for sha, subject, files in _touched(repo, [f"{since}..HEAD"], paths):
        parent = f"{sha}^"
        for unit in (u for u in union if u.path in files):
            before, after = digests.of(parent, unit), digests.of(sha, unit)
            if before == after:
                continue
            bases = tuple(v for v in versions if unit in watched.get(v, set()))
            out.append(
                Candidate(
                    id=f"{VLLM}/{sha[:12]}/{unit}",
                    source=VLLM,
                    summary=f"{unit} {_verb(before, after)} by {sha[:12]} {subject}",
                    bases=bases,
                )
            )
    return out


def _aiter_version(tag: str) -> Version | None:
    try:
        return Version(tag.removeprefix("v"))
    except InvalidVersion:
        return None


def _aiter_unit(spec: str) -> Unit:
    """``path.py:function`` -> that function; anything else a whole file or glob."""
    path, sep, name = spec.rpartition(":")
    if sep and path.endswith(".py") and name.isidentifier():
        return Unit(path, name)
    return Unit(spec)


def aiter_candidates(
    repo: Path,
    pins: Mapping[str, str],
    groups: Sequence[AiterWatch],
    reached: Mapping[str, set[int]],
) -> tuple[list[Candidate], list[str]]:
    """AITER commits that change an entry point of ``groups`` and that a base's
    pinned tag lacks (``pins``: base -> tag), from every later tag and the main
    line; a commit concerns the bases whose fork tree reaches the entry point
    (``reached``: base -> indexes of ``groups``). A commit counts as present in a
    tag when a commit of the same subject is (release branches carry fixes as
    cherry-picks). Returns the candidates and the bases whose pin the
    repository does not have."""
    env = git_env({"GIT_DIR": str(repo)})
    tags = [t for t in git_out(["tag", "--list"], env=env).split() if _aiter_version(t)]
    tags.sort(key=lambda t: _aiter_version(t) or Version("0"))
    missing = [v for v, tag in pins.items() if tag not in tags]
    known = {v: tag for v, tag in pins.items() if tag in tags}
    specs = [[_aiter_unit(u) for u in g.units] for g in groups]
    paths = sorted({u.path for units in specs for u in units})
    if not known or not paths:
        return [], missing
    pathspecs = [f":(glob){p}" for p in paths]
    order = {t: i for i, t in enumerate(tags)}
    oldest = min(known.values(), key=order.__getitem__)
    later = [t for t in tags if order[t] > order[oldest]]
    present: dict[str, tuple[set[str], set[str]]] = {}
    for tag in set(known.values()):
        have = _touched(repo, [tag], pathspecs)
        present[tag] = ({s for s, _, _ in have}, {subject for _, subject, _ in have})
    first_tag: dict[str, str] = {}
    for tag in later:
        for sha in git_out(["rev-list", tag, f"^{oldest}", "--", *pathspecs], env=env).split():
            first_tag.setdefault(sha, tag)
    digests = _Digests(repo)
    out: list[Candidate] = []
    for sha, subject, files in _touched(repo, ["HEAD", *later, f"^{oldest}"], pathspecs):
        hit = [
            i
            for i, units in enumerate(specs)
            if any(_hits(digests, sha, unit, files) for unit in units)
        ]
        if not hit:
            continue
        bases = tuple(
            v
            for v, tag in known.items()
            if reached.get(v, set()) & set(hit)
            and sha not in present[tag][0]
            and subject not in present[tag][1]
        )
        if not bases:
            continue
        what = ", ".join(groups[i].what for i in hit)
        out.append(
            Candidate(
                id=f"{AITER}/{sha[:12]}",
                source=AITER,
                summary=f"{subject} [{first_tag.get(sha, 'main only')}; {what}]",
                bases=bases,
            )
        )
    return out, missing


def _hits(digests: _Digests, sha: str, unit: Unit, files: Sequence[str]) -> bool:
    if unit.name == WHOLE_FILE:
        return any(fnmatch.fnmatch(f, unit.path) for f in files)
    if unit.path not in files:
        return False
    return digests.of(f"{sha}^", unit) != digests.of(sha, unit)


# --- the whole watch --------------------------------------------------------------


def _clone(config: Workspace, url: str, name: str) -> Path:
    """A bare clone of ``url`` in the cache (fetched again when present)."""
    if config.offline:
        raise UsageError(f"{url} is not a local directory and --offline forbids the network")
    target = config.cache.watch_clone(name)
    env = git_env()
    if (target / "HEAD").is_file():
        log.info("fetching %s into %s (network: the watch was given a URL)", url, target)
        run_git(["--git-dir", str(target), "fetch", "--tags", "--prune", url], env=env)
    else:
        log.info("cloning %s into %s (network: the watch was given a URL)", url, target)
        target.parent.mkdir(parents=True, exist_ok=True)
        # blobs come on demand: the watch reads few files of a large history
        run_git(["clone", "--bare", "--quiet", "--filter=blob:none", url, str(target)], env=env)
    return target


def resolve_repo(config: Workspace, where: str | None, name: str) -> Path | None:
    """A repository given as a directory (a clone, bare or not) or a URL."""
    if where is None:
        return None
    if re.match(r"^[a-z][a-z0-9+.-]*://", where):
        return _clone(config, where, name)
    path = Path(where).expanduser()
    if not path.is_dir():
        raise UsageError(f"--{name}-repo {where}: not a directory or a URL")
    if (path / ".git").exists():  # a clone with a work tree
        path = path / ".git"
    if not (path / "HEAD").is_file():
        raise UsageError(f"--{name}-repo {where}: not a git repository")
    return path


def _since(repo: Path, newest: str, since: str | None) -> str:
    env = git_env({"GIT_DIR": str(repo)})
    candidates = [since] if since else [f"v{newest}", newest, f"refs/tags/v{newest}"]
    for rev in candidates:
        found = run_git(
            ["rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"], env=env, check=False
        )
        if found.returncode == 0:
            return found.stdout.decode().strip()
    if since:
        raise UsageError(f"--vllm-since {since}: not a commit of {repo}")
    raise UsageError(
        f"{repo} has no tag v{newest} (the newest pinned release): give the commit of that "
        "release with --vllm-since REV"
    )


def watch(
    config: Workspace,
    *,
    vllm_repo: str | None = None,
    vllm_since: str | None = None,
    aiter_repo: str | None = None,
    fetch: bool = False,
    triage: Triage | None = None,
) -> WatchReport:
    """The candidates of every supported base, with their triage decisions."""
    repo = config.upstream_repo
    versions = [v for v in config.pins.versions() if config.base(v).supported]
    triage = triage or load_triage(config.root / TRIAGE_FILE, (i.id for i in config.known_issues))
    report = WatchReport(bases=versions, candidates=[])
    imported: list[str] = []
    for version in versions:
        if fetch:
            ensure_upstream(config, config.base(version), config.fetcher)
        if imported_sha256(repo, version) is None:
            report.not_covered.append(
                f"{version}: not in the cache (vllm-fork fetch --base {version}, or watch --fetch)"
            )
        else:
            imported.append(version)
    report.read.append(f"vLLM: {len(imported)} of {len(versions)} pinned releases from {repo}")
    watched: dict[str, set[Unit]] = {}
    fork_trees: dict[str, GitTree] = {}
    for version in imported:
        try:
            watched[version], fork_trees[version] = watched_units(config, version)
        except ForkError as exc:
            report.not_covered.append(f"{version}: its series cannot be read ({exc})")
    report.candidates += release_candidates(repo, [v for v in imported if v in watched], watched)

    clone = resolve_repo(config, vllm_repo, "vllm")
    if clone is not None and imported:
        newest = imported[-1]
        since = _since(clone, newest, vllm_since)
        report.read.append(f"vLLM: commits after {since[:12]} (release {newest}) in {clone}")
        report.candidates += repo_candidates(clone, since, watched, imported)
    elif clone is None:
        report.read.append(
            "vLLM: no repository given (--vllm-repo): commits after the newest "
            "pinned release are not watched"
        )

    aiter = resolve_repo(config, aiter_repo, "aiter")
    report.aiter = {v: aiter_pin(GitTree(repo, tag_for(v))) for v in imported}
    with_pin = {v: t for v, t in report.aiter.items() if t}
    if aiter is not None:
        reached = {
            v: {i for i, g in enumerate(triage.aiter) if g.reached.check(tree)[0]}
            for v, tree in fork_trees.items()
        }
        found, missing = aiter_candidates(aiter, with_pin, triage.aiter, reached)
        report.candidates += found
        report.read.append(
            f"AITER: {len(triage.aiter)} entry points ({TRIAGE_FILE} [[watch.aiter]]) in {aiter}"
        )
        for version in missing:
            report.not_covered.append(
                f"{version}: its AITER pin {with_pin[version]} is not a tag of {aiter}"
            )
    else:
        report.not_covered.append("AITER: no repository given (--aiter-repo DIR|URL)")

    seen = set()
    for candidate in report.candidates:
        candidate.decision = triage.decision(candidate.id)
        seen.add(candidate.id)
    report.stale = sorted(set(triage.decisions) - seen)
    return report


def untriaged_for_base(config: Workspace, version: str) -> list[Candidate]:
    """The vLLM candidates that concern base ``version`` (read from the cache: the
    releases from it on) and that the triage file does not decide."""
    triage = load_triage(config.root / TRIAGE_FILE, (i.id for i in config.known_issues))
    later = [
        v
        for v in config.pins.versions()
        if Version(v) >= Version(version) and imported_sha256(config.upstream_repo, v)
    ]
    units, _ = watched_units(config, version)
    found = release_candidates(config.upstream_repo, later, {version: units})
    return [c for c in found if triage.decision(c.id) is None]


def format_watch(report: WatchReport, *, show_all: bool = False) -> str:
    lines = [f"read: {line}" for line in report.read]
    per_base = report.per_base()
    lines.append("")
    lines.append("| base | AITER pin | candidates | untriaged |")
    lines.append("|---|---|---|---|")
    for version, (n, u) in per_base.items():
        lines.append(f"| {version} | {report.aiter.get(version) or '-'} | {n} | {u} |")
    shown = report.candidates if show_all else report.untriaged
    if shown:
        lines.append("")
        lines.append("candidates:" if show_all else "untriaged candidates:")
    for c in shown:
        lines.append(f"  {c.id}")
        lines.append(f"      {c.summary}")
        lines.append(f"      bases: {format_ranges(c.bases, report.bases)}")
        if c.decision is not None:
            lines.append(f"      {c.decision}")
    for line in report.not_covered:
        lines.append(f"not covered: {line}")
    if report.stale:
        lines.append(f"{len(report.stale)} triaged id(s) match no candidate now (kept)")
    total = len(report.candidates)
    left = len(report.untriaged)
    lines.append(f"{total} candidate(s), {total - left} triaged, {left} untriaged")
    return "\n".join(lines)


def format_ranges(bases: Sequence[str], order: Sequence[str]) -> str:
    """``0.21.0-0.25.1, 0.27.0`` for runs of consecutive bases in ``order``."""
    index = {v: i for i, v in enumerate(order)}
    runs: list[list[str]] = []
    for v in sorted(bases, key=lambda b: index.get(b, -1)):
        if runs and index.get(v, -2) == index.get(runs[-1][-1], -5) + 1:
            runs[-1].append(v)
        else:
            runs.append([v])
    return ", ".join(r[0] if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


def write_json(report: WatchReport, path: Path) -> None:
    write_json_atomic(path, report.to_json())
