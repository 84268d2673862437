"""Known upstream bugs in the code the fork's changes touch: the register.

``known-issues.toml`` at the repository root (beside ``bases.toml``) holds one
``[[issue]]`` table per bug that upstream vLLM or AITER found, or fixed, after
the code the fork changes was written. It is data: each entry names its
upstream source, the change it concerns, and three probes over a source tree:

- ``affected``: the tree contains the code the bug is in;
- ``fixed``: the fix is in the tree (upstream's or the fork's);
- ``mitigated`` (optional): a safe default keeps users off the bug while no
  fix exists (for example an AITER kernel that is wrong on one arch).

A probe is a list of clauses; it holds when any clause holds. A clause names a
file (or ``files``: the first that exists), optionally a ``function`` (the
source of every ``def`` of that name in the file, read with ``ast``), and
regular expressions that must all match (``match``) and must not match
(``not_match``). Adding a report costs one entry: status, matrix,
release-check, the release notes and the README table read this file.

The state of an entry on a base follows the Debian security tracker's cells
(see :func:`decide`): ``not affected`` (the code is absent, with the probe's
reason), ``fixed upstream``, ``fixed by fork`` (naming the patches that carry
``Fork-Fixes: <id>``), ``mitigated``, or ``AFFECTED``. ``release-check`` fails a
base with an ``AFFECTED`` entry.
"""

from __future__ import annotations

import ast
import functools
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from vllm_fork.aiterpin import ROCM_BASE_DOCKERFILE, aiter_pin, aiter_version
from vllm_fork.errors import ConfigError
from vllm_fork.sourcetree import SourceTree

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

REGISTER_FILE = "known-issues.toml"
# The trailer a patch names the entry it fixes with (one line per entry).
FIXES_TRAILER = "Fork-Fixes"

NOT_AFFECTED = "not affected"
FIXED_UPSTREAM = "fixed upstream"
FIXED_FORK = "fixed by fork"
MITIGATED = "mitigated"
AFFECTED = "AFFECTED"
STATES = (NOT_AFFECTED, FIXED_UPSTREAM, FIXED_FORK, MITIGATED, AFFECTED)

DECISIONS = ("fix", "mitigate")
TRACKERS = {
    "vllm": "https://github.com/vllm-project/vllm/",
    "aiter": "https://github.com/ROCm/aiter/",
}
_REF = re.compile(r"^(?P<tracker>[a-z]+)#(?P<number>\d+)$")
_ID = re.compile(r"^[a-z0-9][a-z0-9.-]*$")
_ISSUE_KEYS = {
    "id",
    "title",
    "tracker_refs",
    "change",
    "impact",
    "decision",
    "reason",
    "upstream_fix",
    "fix_authors",
    "until",
    "affected",
    "fixed",
    "mitigated",
}
_CLAUSE_KEYS = {"file", "files", "function", "match", "not_match", "why"}
_AITER_CLAUSE_KEYS = {"aiter_below", "why"}


@dataclass(frozen=True)
class Clause:
    """One alternative of a probe: a file, an optional function, its patterns."""

    files: tuple[str, ...]
    match: tuple[re.Pattern[str], ...]
    not_match: tuple[re.Pattern[str], ...] = ()
    function: str | None = None
    why: str = ""  # what the clause looks for, in words (for reasons)

    def check(self, tree: SourceTree) -> tuple[bool, str]:
        """Whether the clause holds in ``tree``, and one line saying why."""
        path = next((p for p in self.files if tree.read_text(p) is not None), None)
        if path is None:
            return False, f"no {' or '.join(self.files)}"
        text = tree.read_text(path) or ""
        where = path
        if self.function is not None:
            bodies = function_sources(text, self.function)
            if not bodies:
                return False, f"{path} has no function {self.function}()"
            text = "\n".join(bodies)
            where = f"{path}:{self.function}()"
        for pattern in self.match:
            if not pattern.search(text):
                what = self.why or f"/{pattern.pattern}/"
                return False, f"{where} lacks {what}"
        for pattern in self.not_match:
            if pattern.search(text):
                what = self.why or f"no /{pattern.pattern}/"
                return False, f"{where} lacks {what}"
        return True, f"{where}: {self.why or 'matches'}"


@dataclass(frozen=True)
class AiterBelow:
    """The AITER the tree's ROCm base image pins is a release older than ``below``
    (``docker/Dockerfile.rocm_base``; a branch or commit pin is not a release)."""

    below: str
    why: str = ""

    def check(self, tree: SourceTree) -> tuple[bool, str]:
        pin = aiter_pin(tree)
        if pin is None:
            return False, f"no AITER pin in {ROCM_BASE_DOCKERFILE}"
        version = aiter_version(pin)
        if version is None:
            return False, f"the AITER pin {pin} is not a release"
        if version < Version(self.below):
            return True, f"{ROCM_BASE_DOCKERFILE} pins AITER {pin}, older than {self.below}"
        return False, f"{ROCM_BASE_DOCKERFILE} pins AITER {pin}, not older than {self.below}"


@dataclass(frozen=True)
class AllOf:
    """Clauses that must all hold (e.g. code in two files)."""

    clauses: tuple[Clause | AiterBelow, ...]

    def check(self, tree: SourceTree) -> tuple[bool, str]:
        reasons = []
        for clause in self.clauses:
            ok, reason = clause.check(tree)
            if not ok:
                return False, reason
            reasons.append(reason)
        return True, "; ".join(reasons)


@dataclass(frozen=True)
class Probe:
    """Clauses of which any one holding makes the probe hold."""

    clauses: tuple[Clause | AiterBelow | AllOf, ...]

    def check(self, tree: SourceTree) -> tuple[bool, str]:
        reasons = []
        for clause in self.clauses:
            ok, reason = clause.check(tree)
            if ok:
                return True, reason
            reasons.append(reason)
        return False, "; ".join(dict.fromkeys(reasons))


@dataclass(frozen=True)
class KnownIssue:
    id: str
    title: str
    refs: tuple[str, ...]  # "vllm#47404", "aiter#4888"
    change: str  # the fork change id (or "rope-fast-kernel" ...) it concerns
    impact: str  # one line: what users see
    decision: str  # "fix" (a patch on every affected base) or "mitigate" (a safe default)
    reason: str  # one line: why that decision
    affected: Probe
    fixed: Probe | None  # None: no fix is known (a mitigation stands in)
    mitigated: Probe | None = None
    upstream_fix: str | None = None  # first upstream release with the fix, when known
    fix_authors: tuple[str, ...] = ()  # who wrote upstream's fix (credited by our backport)
    until: str = ""  # for a mitigation: what ends it (e.g. an AITER tag that fixes it)

    @property
    def urls(self) -> tuple[str, ...]:
        return tuple(ref_url(ref) for ref in self.refs)


@dataclass(frozen=True)
class IssueState:
    """One cell of the register's table: an entry on one base."""

    issue: str
    state: str
    reason: str
    patches: tuple[str, ...] = field(default_factory=tuple)

    def to_json(self) -> dict[str, Any]:
        return {"state": self.state, "reason": self.reason, "patches": list(self.patches)}


def ref_url(ref: str) -> str:
    """``vllm#47404`` -> the tracker URL (GitHub redirects issues and pulls alike)."""
    found = _REF.match(ref)
    if not found or found["tracker"] not in TRACKERS:
        raise ValueError(f"not a tracker reference: {ref!r}")
    return f"{TRACKERS[found['tracker']]}issues/{found['number']}"


def function_sources(text: str, name: str) -> list[str]:
    """The source of every function or method called ``name`` in ``text``
    (empty when there is none or the file does not parse)."""
    return list(_functions(text).get(name, ()))


@functools.lru_cache(maxsize=64)
def _functions(text: str) -> dict[str, tuple[str, ...]]:
    """Every function's and method's source in ``text`` by name, in ``ast.walk``
    order. Parsed once per text: the probes of every entry on every base ask the
    same few files for their functions thousands of times (status, drift)."""
    try:
        module = ast.parse(text)
    except SyntaxError:
        return {}
    lines = text.splitlines()
    out: dict[str, list[str]] = {}
    for node in ast.walk(module):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            # whole lines, so comments on the first and last lines count too
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            out.setdefault(node.name, []).append("\n".join(lines[first - 1 : node.end_lineno]))
    return {k: tuple(v) for k, v in out.items()}


# --- reading the register ---------------------------------------------------------


def _strings(value: Any, where: str) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise ConfigError(f"{where}: expected a string or a non-empty list of strings")


def _regexes(value: Any, where: str) -> tuple[re.Pattern[str], ...]:
    out = []
    for text in _strings(value, where):
        try:
            out.append(re.compile(text, re.MULTILINE))
        except re.error as exc:
            raise ConfigError(f"{where}: bad regular expression {text!r}: {exc}") from exc
    return tuple(out)


def _clause(data: Any, where: str) -> Clause | AiterBelow:
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: a probe clause must be a table")
    if "aiter_below" in data:
        unknown = set(data) - _AITER_CLAUSE_KEYS
        if unknown:
            raise ConfigError(
                f"{where}: unknown key(s) with aiter_below: {', '.join(sorted(unknown))}"
            )
        below = data["aiter_below"]
        try:
            Version(below if isinstance(below, str) else "")
        except InvalidVersion:
            raise ConfigError(
                f'{where}.aiter_below: expected an AITER release, e.g. "0.1.19.post1"'
            ) from None
        why = data.get("why", "")
        if not isinstance(why, str) or "\n" in why:
            raise ConfigError(f"{where}.why: expected one line of text")
        return AiterBelow(below, why)
    unknown = set(data) - _CLAUSE_KEYS
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")
    if ("file" in data) == ("files" in data):
        raise ConfigError(f"{where}: give exactly one of 'file' or 'files'")
    files = _strings(data.get("file", data.get("files")), f"{where}.files")
    if "match" not in data:
        raise ConfigError(f"{where}: 'match' is required")
    function = data.get("function")
    if function is not None and not (isinstance(function, str) and function.isidentifier()):
        raise ConfigError(f"{where}.function: expected a Python identifier")
    why = data.get("why", "")
    if not isinstance(why, str) or "\n" in why:
        raise ConfigError(f"{where}.why: expected one line of text")
    return Clause(
        files=files,
        match=_regexes(data["match"], f"{where}.match"),
        not_match=_regexes(data["not_match"], f"{where}.not_match") if "not_match" in data else (),
        function=function,
        why=why,
    )


def _alternative(data: Any, where: str) -> Clause | AiterBelow | AllOf:
    """A clause, or ``{ all = [clause, ...] }``: clauses that must all hold."""
    if isinstance(data, dict) and "all" in data:
        if set(data) != {"all"} or not isinstance(data["all"], list) or not data["all"]:
            raise ConfigError(f"{where}: 'all' takes a non-empty list of clauses, alone")
        return AllOf(tuple(_clause(c, f"{where}.all[{i}]") for i, c in enumerate(data["all"])))
    return _clause(data, where)


def parse_probe(data: Any, where: str) -> Probe:
    """A probe: one clause, ``{ all = [...] }``, or a list of either (any holds)."""
    items = data if isinstance(data, list) else [data]
    if not items:
        raise ConfigError(f"{where}: a probe needs at least one clause")
    return Probe(tuple(_alternative(item, f"{where}[{i}]") for i, item in enumerate(items)))


def _text(data: dict[str, Any], key: str, where: str, *, required: bool = True) -> str:
    value = data.get(key, "" if not required else None)
    if not isinstance(value, str) or (required and not value.strip()) or "\n" in value.strip():
        raise ConfigError(f"{where}.{key}: expected one line of text")
    return value.strip()


def parse_issue(data: Any, where: str, changes: Iterable[str] | None = None) -> KnownIssue:
    """One ``[[issue]]`` table; :class:`ConfigError` names the key that is wrong."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a table")
    unknown = set(data) - _ISSUE_KEYS
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")
    issue_id = _text(data, "id", where)
    if not _ID.match(issue_id):
        raise ConfigError(f"{where}.id: {issue_id!r} is not lower-case letters, digits, '-', '.'")
    where = f"{where} ({issue_id})"
    refs = _strings(data.get("tracker_refs"), f"{where}.tracker_refs")
    for ref in refs:
        try:
            ref_url(ref)
        except ValueError as exc:
            raise ConfigError(
                f"{where}.tracker_refs: {exc} (write {' or '.join(f'{t}#N' for t in TRACKERS)})"
            ) from exc
    change = _text(data, "change", where)
    if changes is not None and change not in set(changes):
        raise ConfigError(f"{where}.change: unknown change {change!r}")
    decision = _text(data, "decision", where)
    if decision not in DECISIONS:
        raise ConfigError(f"{where}.decision: {decision!r} is not one of {', '.join(DECISIONS)}")
    if "affected" not in data:
        raise ConfigError(f"{where}: the 'affected' probe is required")
    if "fixed" not in data and decision != "mitigate":
        raise ConfigError(f"{where}: the 'fixed' probe is required (unless decision = mitigate)")
    mitigated = (
        parse_probe(data["mitigated"], f"{where}.mitigated") if "mitigated" in data else None
    )
    if decision == "mitigate" and mitigated is None:
        raise ConfigError(f"{where}: decision 'mitigate' needs a 'mitigated' probe")
    upstream_fix = data.get("upstream_fix")
    if upstream_fix is not None and not isinstance(upstream_fix, str):
        raise ConfigError(f'{where}.upstream_fix: expected a release, e.g. "0.26.0"')
    authors = data.get("fix_authors", [])
    if not isinstance(authors, list) or not all(isinstance(a, str) for a in authors):
        raise ConfigError(f"{where}.fix_authors: expected a list of strings")
    return KnownIssue(
        id=issue_id,
        title=_text(data, "title", where),
        refs=refs,
        change=change,
        impact=_text(data, "impact", where),
        decision=decision,
        reason=_text(data, "reason", where),
        affected=parse_probe(data["affected"], f"{where}.affected"),
        fixed=parse_probe(data["fixed"], f"{where}.fixed") if "fixed" in data else None,
        mitigated=mitigated,
        upstream_fix=upstream_fix,
        fix_authors=tuple(authors),
        until=_text(data, "until", where, required=False),
    )


def parse_register(
    text: str, source: str = REGISTER_FILE, changes: Iterable[str] | None = None
) -> tuple[KnownIssue, ...]:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: not valid TOML: {exc}") from exc
    unknown = set(data) - {"issue"}
    if unknown:
        raise ConfigError(f"{source}: unknown table(s) {', '.join(sorted(unknown))}")
    entries = data.get("issue", [])
    if not isinstance(entries, list):
        raise ConfigError(f"{source}: 'issue' must be an array of tables ([[issue]])")
    known = list(changes) if changes is not None else None
    issues = tuple(parse_issue(e, f"{source}: issue {i + 1}", known) for i, e in enumerate(entries))
    seen: set[str] = set()
    for issue in issues:
        if issue.id in seen:
            raise ConfigError(f"{source}: issue id {issue.id!r} is listed twice")
        seen.add(issue.id)
    return issues


def load_register(path: Path, changes: Iterable[str] | None = None) -> tuple[KnownIssue, ...]:
    """The register at ``path`` (no file: no known issues)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return ()
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text ({exc.reason})") from exc
    return parse_register(text, str(path), changes)


# --- one entry on one base --------------------------------------------------------


def decide(
    issue: KnownIssue,
    pristine: SourceTree,
    patched: SourceTree,
    fixing_patches: Sequence[str] = (),
) -> IssueState:
    """The state of ``issue`` on a base: ``pristine`` is upstream's tree,
    ``patched`` the tree the fork ships (the base with its series);
    ``fixing_patches`` the series' patches that name the entry in
    ``Fork-Fixes``."""
    affected, why = issue.affected.check(patched)
    if not affected:
        return IssueState(issue.id, NOT_AFFECTED, why)
    fixed_here, fix_why = (
        issue.fixed.check(patched) if issue.fixed is not None else (False, "no fix is known")
    )
    if fixed_here and issue.fixed is not None:
        upstream, _ = issue.fixed.check(pristine)
        if upstream:
            since = f" (since {issue.upstream_fix})" if issue.upstream_fix else ""
            return IssueState(issue.id, FIXED_UPSTREAM, f"upstream's fix{since}: {fix_why}")
        return IssueState(issue.id, FIXED_FORK, fix_why, tuple(fixing_patches))
    if issue.mitigated is not None:
        mitigated, mit_why = issue.mitigated.check(patched)
        if mitigated:
            until = f" until {issue.until}" if issue.until else ""
            return IssueState(issue.id, MITIGATED, f"{mit_why}{until}", tuple(fixing_patches))
    return IssueState(issue.id, AFFECTED, f"{why}; {fix_why}")


def decide_all(
    issues: Sequence[KnownIssue],
    pristine: SourceTree,
    patched: SourceTree,
    fixes: dict[str, list[str]] | None = None,
) -> tuple[IssueState, ...]:
    """Every entry on one base; ``fixes`` maps an entry id to its fixing patches."""
    fixes = fixes or {}
    return tuple(decide(i, pristine, patched, fixes.get(i.id, ())) for i in issues)


def fixing_patches(patches: Iterable[tuple[str, Iterable[str]]]) -> dict[str, list[str]]:
    """``{entry id: [patch names]}`` from (patch name, its ``Fork-Fixes`` values)."""
    out: dict[str, list[str]] = {}
    for name, ids in patches:
        for issue_id in ids:
            out.setdefault(issue_id, []).append(name)
    return out


def affected(states: Iterable[IssueState]) -> list[IssueState]:
    return [s for s in states if s.state == AFFECTED]
