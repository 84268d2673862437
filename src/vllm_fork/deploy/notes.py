"""Release notes (Markdown) of a fork build, ready to paste into an announcement.

Everything comes from the wheel's provenance record (changes, parts, upstream
PRs, patches) and the probes' table of hardening items; "what changed" compares
with the record of the previous fork version of the same base.
"""

from __future__ import annotations

from typing import Any

from vllm_fork.probes import HARDENING

SUFFIX = ".notes.md"


def change_states(record: dict[str, Any]) -> dict[str, str]:
    """Per change in the series: how this build has it (read from the patches' parts)."""
    parts: dict[str, set[str]] = {}
    for p in record["series"]["patches"]:
        parts.setdefault(p["change"], set()).add(p.get("part", "change"))
    states = {}
    for change, kinds in parts.items():
        if "change" in kinds:
            extra = sorted(kinds - {"change"})
            states[change] = "carried by the fork" + (f" (+ {', '.join(extra)})" if extra else "")
        else:
            states[change] = f"{', '.join(sorted(kinds))} only (no change patch)"
    return states


def _since(record: dict[str, Any], previous: dict[str, Any] | None) -> list[str]:
    if previous is None:
        return [f"First fork version of vLLM {record['base']['version']} (no earlier one given)."]
    lines = [f"Compared with {previous['version']}:", ""]
    old = {p["file"]: p for p in previous["series"]["patches"]}
    new = {p["file"]: p for p in record["series"]["patches"]}
    for f in new.keys() - old.keys():
        lines.append(f"- added `{f}` ({new[f]['change']}, {new[f].get('part', 'change')})")
    for f in old.keys() - new.keys():
        lines.append(f"- removed `{f}` ({old[f]['change']})")
    for f in sorted(new.keys() & old.keys()):
        if new[f]["sha256"] != old[f]["sha256"]:
            lines.append(f"- changed `{f}` ({new[f]['change']})")
    before, after = change_states(previous), change_states(record)
    for change in sorted(before.keys() | after.keys()):
        a, b = before.get(change, "not in the series"), after.get(change, "not in the series")
        if a != b:
            lines.append(f"- {change}: {a} -> {b}")
    if previous["build"] != record["build"]:
        lines.append(f"- build: {previous['build']} -> {record['build']}")
    if len(lines) == 2:
        lines.append("- no change to the series")
    # keep added/removed in series order for a stable text
    return lines[:2] + sorted(lines[2:])


def make_notes(
    record: dict[str, Any],
    *,
    wheel_name: str,
    wheel_sha256: str,
    previous: dict[str, Any] | None = None,
    findings: dict[str, Any] | None = None,
) -> str:
    """The notes; ``findings``: the probes' findings on the built tree (change -> Finding)."""
    base = record["base"]
    build = record["build"]
    patches = record["series"]["patches"]
    prs: dict[str, str] = {}
    for p in patches:
        if p.get("upstream_pr"):
            prs.setdefault(p["change"], p["upstream_pr"])
    out = [
        f"# vLLM {record['version']} (hardened fork)",
        "",
        f"- **Base**: vLLM {base['version']} (`{base['sdist']['filename']}`, "
        f"sha256 `{base['sdist']['sha256']}`)",
        f"- **Wheel**: `{wheel_name}` (sha256 `{wheel_sha256}`)",
        f"- **Build**: {build['mode']} mode, {build['device']}; "
        f"{record['tool']['name']} {record['tool']['version']}",
        f"- **Series**: revision {record['series']['revision']}, {len(patches)} patch(es)",
        "",
        "## Changes",
        "",
        "| change | in the series | probed in the built sources | upstream PR |",
        "| --- | --- | --- | --- |",
    ]
    states = change_states(record)
    changes = list(states) + [c for c in (findings or {}) if c not in states]
    for change in changes:
        found = findings.get(change) if findings else None
        probed = f"{found.state}: {found.reason}" if found else "-"
        series_state = states.get(change, "not in the series")
        out.append(f"| {change} | {series_state} | {probed} | {prs.get(change, '-')} |")
    out += ["", "## Hardening items", ""]
    for change in changes:
        items = HARDENING.get(change, ())
        if not items:
            continue
        found = findings.get(change) if findings else None
        marks = [
            f"{item} ({'yes' if found.hardening.get(item) else 'no'})" if found else item
            for item in items
        ]
        out.append(f"- {change}: {', '.join(marks)}")
    out += ["", "## Patches", "", "| patch | change | part | sha256 |", "| --- | --- | --- | --- |"]
    for p in patches:
        out.append(
            f"| `{p['file']}` | {p['change']} | {p.get('part', 'change')} | `{p['sha256'][:16]}` |"
        )
    out += ["", "## Since the previous fork version", "", *_since(record, previous), ""]
    return "\n".join(out)
