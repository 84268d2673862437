"""The change tables of README.md and docs/changes.md, generated from the registry.

Each table sits between two marker lines in its document::

    <!-- generated: python -m vllm_fork.reports.tables --write (readme) -->
    ...
    <!-- end generated -->

``python -m vllm_fork.reports.tables`` prints the tables, ``--write``
rewrites them in place, ``--check`` exits 1 when a document's table differs
from the generated one (the tool's tests run the same check).

The README's per-base cells apply the state rule (vllm_fork.facts.state)
to what the registry declares for each pristine release and to the patches
of ``series/<V>/``.
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from vllm_fork.atomic import write_bytes_atomic
from vllm_fork.config import find_root
from vllm_fork.diffs import is_test_module, touched_paths
from vllm_fork.errors import ExitCode, ForkError
from vllm_fork.facts import registry
from vllm_fork.facts.known_issues import ref_url
from vllm_fork.facts.state import (
    CARRIED,
    PART_CHANGE,
    PART_HARDENING,
    PART_TESTS,
    UPSTREAM,
    decide,
)
from vllm_fork.probes.rocm_pins import base_aiter
from vllm_fork.reports.status import base_issue_states
from vllm_fork.series import store
from vllm_fork.series.forkversion import series_revision
from vllm_fork.series.patches import BUILD_FULL
from vllm_fork.sources.upstream import imported_sha256
from vllm_fork.sources.workspace import Workspace, load_config

log = logging.getLogger(__name__)

README = "README.md"
CHANGES_DOC = "docs/changes.md"
_BEGIN = "<!-- generated: python -m vllm_fork.reports.tables --write ({name}) -->"
_END = "<!-- end generated -->"


def _row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _table(header: Sequence[str], rows: list[list[str]]) -> str:
    lines = [_row(header), "|" + "---|" * len(header)]
    return "\n".join([*lines, *(_row(r) for r in rows)])


def base_cell(
    change: registry.Change, version: str, parts: list[str], full_only: bool = False
) -> str:
    """One README cell: the change's state on ``version`` with its series' parts;
    ``full_only``: every ``change`` patch of it is marked ``Fork-Build: full`` (a
    precompiled wheel lacks the change; its hardening patches may still be there)."""
    state = decide(change.expected_upstream(version), parts)
    if full_only and state == CARRIED:
        state += " (full build only)"
    if state.startswith((CARRIED, UPSTREAM)) and PART_HARDENING in parts:
        state = f"{state} + hardening"
    elif state == UPSTREAM and PART_TESTS in parts:
        state = f"{state} (pinned by tests)"
    return state


def readme_table(config: Workspace) -> str:
    """Per base that has a series (the default marked), the state of every change."""
    pins = config.pins
    versions = [v for v in pins.versions() if store.has_series(config.series_root, v)]
    parts: dict[str, dict[str, list[str]]] = {}
    full_only: dict[str, set[str]] = {}
    for version in versions:
        series = config.series(version)
        by_change: dict[str, list[str]] = {}
        builds: dict[str, set[str]] = {}  # Fork-Build of each change's `change` patches
        for header in series.headers:
            by_change.setdefault(header.change, []).append(header.part)
            if header.part == PART_CHANGE:
                builds.setdefault(header.change, set()).add(header.build)
        parts[version] = by_change
        full_only[version] = {c for c, b in builds.items() if b == {BUILD_FULL}}
    # One row per base: twenty bases side by side would not fit a screen.
    changes = registry.changes()
    columns = ["base", *(f"{c.id} ({f'#{c.pr}' if c.pr else 'vendor'})" for c in changes)]
    rows = [
        [
            f"{v} (default)" if v == pins.default else v,
            *(base_cell(c, v, parts[v].get(c.id, []), c.id in full_only[v]) for c in changes),
        ]
        for v in versions
    ]
    return _table(columns, rows)


def _ranges(landings: list[registry.Landing]) -> str:
    spans = []
    for landing in landings:
        if landing.since and landing.until:
            spans.append(f"{landing.since}-{landing.until}")
        elif landing.since:
            spans.append(f"from {landing.since}")
        elif landing.until:
            spans.append(f"until {landing.until}")
    return f" ({', '.join(spans)})" if spans else ""


def _files(change: registry.Change) -> str:
    by_path: dict[str, list[registry.Landing]] = {}
    for landing in change.files:
        by_path.setdefault(landing.path, []).append(landing)
    cells = []
    for path, landings in by_path.items():
        added = " (added by the fork)" if any(x.added for x in landings) else ""
        cells.append(f"`{path}`{_ranges(landings)}{added}")
    return ", ".join(cells)


def changes_table(_config: Workspace | None = None) -> str:
    """Per change: its upstream PR, where it lands and the first release with it."""
    rows = [
        [
            f"`{c.id}`",
            f"[#{c.pr}]({c.pr_url})" if c.pr else "- (vendor change)",
            _files(c),
            c.upstream_since or "-",
        ]
        for c in registry.changes()
    ]
    rows += [
        [f"`{s.id}`", "-", ", ".join(f"`{f}`" for f in s.files) + f" ({s.title})", "-"]
        for s in registry.SUPPORT
    ]
    return _table(["id", "upstream PR", "files in the vLLM tree", "first upstream release"], rows)


def hardening_table(_config: Workspace | None = None) -> str:
    rows = [
        [
            f"`{c.id}`",
            f"`{h.id}`",
            h.description,
            "every base" if h.until is None else f"up to {h.until}: {h.until_why}",
        ]
        for c in registry.changes()
        for h in c.hardening
    ]
    return _table(["change", "hardening item", "what it adds", "bases"], rows)


def series_tests(config: Workspace) -> dict[str, set[str]]:
    """Change id -> the test modules its patches add or change, over every series:
    a backported fix brings its tests as data, with no registry edit."""
    out: dict[str, set[str]] = {}
    for version in store.versions(config.series_root):
        series = config.series(version)
        for patch, header in zip(series.patches, series.headers, strict=True):
            text = patch.read_text(encoding="utf-8", errors="replace")
            found = {p for p in touched_paths(text, patch.name) if is_test_module(p)}
            out.setdefault(header.change, set()).update(found)
    return out


def lifecycle_table(config: Workspace | None = None) -> str:
    found = series_tests(config) if config is not None else {}
    rows = [
        [
            f"`{c.id}`",
            c.why,
            c.retire_when,
            ", ".join(f"`{t}`" for t in sorted(set(c.tests) | found.get(c.id, set()))),
        ]
        for c in registry.changes()
    ]
    return _table(["change", "why the fork carries it", "retire", "fork tests"], rows)


_SHORT = {
    "not affected": "-",
    "fixed upstream": "upstream",
    "fixed by fork": "**fork**",
    "mitigated": "**mitigated**",
    "AFFECTED": "**AFFECTED**",
}


def _current_cells(root: Path) -> dict[tuple[str, str], str]:
    """The state cells of the known-issue table the README has now."""
    begin = _BEGIN.format(name="known-issues")
    try:
        text = (root / README).read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    start = text.find(begin)
    if start < 0:
        return {}
    block = text[start : text.find(_END, start)].splitlines()
    header = next((line for line in block if line.startswith("| known issue |")), None)
    if header is None:
        return {}
    versions = [c.strip() for c in header.strip("|").split("|")[1:]]
    cells = {}
    for line in block[block.index(header) + 2 :]:
        if not line.startswith("| "):
            break
        row = [c.strip() for c in line.strip("|").split("|")]
        for version, cell in zip(versions, row[1:], strict=False):
            cells[(row[0], version)] = cell
    return cells


# The first row of the known-issue table: the AITER each base's ROCm image pins,
# which the AITER entries' states depend on.
AITER_ROW = "AITER pinned (docker/Dockerfile.rocm_base)"


def known_issues_table(config: Workspace) -> str:
    """The register (one row per entry) and each entry's state on every base with
    its series, probed from the cached upstream sources; offline, a release not in
    the cache keeps the README's cell (``--write --fetch`` fetches it)."""
    issues = config.known_issues
    if not issues:
        return "known-issues.toml lists none."
    pins = config.pins
    rows = []
    for issue in issues:
        links = ", ".join(f"[{ref}]({ref_url(ref)})" for ref in issue.refs)
        decision = issue.decision + (f" until {issue.until}" if issue.until else "")
        rows.append([f"`{issue.id}`", f"{issue.title} ({links})", issue.change, decision])
    out = [_table(["entry", "upstream", "change", "decision"], rows), ""]
    versions = list(pins.versions())
    current = _current_cells(config.root)
    cells: dict[str, dict[str, str]] = {i.id: {} for i in issues}
    aiter: dict[str, str] = {}
    for version in versions:
        base = pins.get(version)
        states = None
        if (
            not config.offline
            or imported_sha256(config.upstream_repo, version) == base.sdist.sha256
        ):
            try:
                states = {s.issue: s.state for s in base_issue_states(config, version)}
                aiter[version] = base_aiter(config, version) or "-"
            except ForkError as exc:
                log.warning("known issues of %s not probed: %s", version, exc)
        if version not in aiter:
            aiter[version] = current.get((AITER_ROW, version), "?")
        for issue in issues:
            if states is not None:
                cells[issue.id][version] = _SHORT[states[issue.id]]
            else:
                cells[issue.id][version] = current.get((f"`{issue.id}`", version), "?")
    out.append(
        _table(
            ["known issue", *versions],
            [
                [AITER_ROW, *(aiter[v] for v in versions)],
                *([f"`{i.id}`", *(cells[i.id][v] for v in versions)] for i in issues),
            ],
        )
    )
    return "\n".join(out)


TABLES: dict[str, tuple[str, Callable[[Workspace], str]]] = {
    "readme": (README, readme_table),
    "known-issues": (README, known_issues_table),
    "changes": (CHANGES_DOC, changes_table),
    "hardening": (CHANGES_DOC, hardening_table),
    "lifecycle": (CHANGES_DOC, lifecycle_table),
}


def render(text: str, config: Workspace, document: str) -> str:
    """``text`` (the document) with every generated table of it replaced."""
    for name, (doc, make) in TABLES.items():
        if doc != document:
            continue
        begin = _BEGIN.format(name=name)
        pattern = re.compile(re.escape(begin) + r"\n.*?" + re.escape(_END), re.DOTALL)
        found = pattern.search(text)
        if not found:
            raise ValueError(f"{document} has no generated block {name!r} (line {begin!r})")
        block = f"{begin}\n{make(config)}\n{_END}"
        text = text[: found.start()] + block + text[found.end() :]
    return text


# A fork version label in the docs (`0.21.0+hardened.26`, `.nofull` after it kept).
LABEL = re.compile(r"(\d+\.\d+\.\d+)\+hardened\.(\d+)")


def relabel(text: str, config: Workspace) -> str:
    """``text`` with each fork version label of a base with a series made the one a
    build of that base makes now (the series revision): a patch added to the default
    base leaves no stale label in the docs after ``--write``."""

    def label(found: re.Match[str]) -> str:
        base = found.group(1)
        if base not in config.pins.bases or not store.has_series(config.series_root, base):
            return found.group(0)
        series = config.series(base)
        return f"{base}+hardened.{series_revision(config.series_dir(base), len(series.patches))}"

    return LABEL.sub(label, text)


def documents(config: Workspace) -> list[str]:
    """The documents ``--write`` keeps: those with generated tables, and every
    Markdown file under docs/ (their version labels)."""
    docs = sorted(str(p.relative_to(config.root)) for p in (config.root / "docs").glob("*.md"))
    return list(dict.fromkeys([*(doc for doc, _ in TABLES.values()), *docs]))


def regenerate(text: str, config: Workspace, document: str) -> str:
    """``document`` as ``--write`` makes it: its tables and its version labels."""
    return relabel(render(text, config, document), config)


def stale(config: Workspace) -> list[str]:
    """The documents whose generated tables or version labels differ from what
    the registry and the series make."""
    out = []
    for document in documents(config):
        text = (config.root / document).read_text(encoding="utf-8")
        if regenerate(text, config, document) != text:
            out.append(document)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m vllm_fork.reports.tables",
        description="Print, check or rewrite the change tables of README.md and docs/changes.md.",
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="exit 1 if a document is stale")
    mode.add_argument("--write", action="store_true", help="rewrite the tables in place")
    parser.add_argument("--root", type=Path, help="repository root (default: found from here)")
    parser.add_argument(
        "--fetch",
        action="store_true",
        help="fetch the releases the known-issue table needs that are not in the cache",
    )
    args = parser.parse_args(argv)
    root = args.root if args.root is not None else find_root()
    config = load_config(root=root, offline=not args.fetch)
    if args.check:
        bad = stale(config)
        for document in bad:
            print(f"{document}: change tables differ from the registry", file=sys.stderr)
        return ExitCode.FAILED if bad else ExitCode.OK
    if args.write:
        for document in documents(config):
            path = root / document
            text = path.read_text(encoding="utf-8")
            new = regenerate(text, config, document)
            if new != text:
                write_bytes_atomic(path, new.encode())
                log.info(f"rewrote the change tables and version labels of {document}")
        return ExitCode.OK
    for name, (document, make) in TABLES.items():
        print(f"{document} ({name}):\n{make(config)}\n")
    return ExitCode.OK


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
