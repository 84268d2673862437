"""Release notes (Markdown) of a fork build, ready to paste into an announcement.

The patches, their changes, parts and upstream PRs come from the wheel's
provenance record; titles and hardening items from the change registry; each
change's state from the state rule applied to the probes of the pristine base
and of the built tree (when the build gives them). "What changed" compares
with the record of the previous fork version of the same base.
"""

from __future__ import annotations

from typing import Any

from vllm_fork.facts import registry
from vllm_fork.facts.state import CARRIED, LEGEND, carries, decide

SUFFIX = ".notes.md"
NOT_IN_BUILD = "not in this build (full build only)"


def change_states(record: dict[str, Any]) -> dict[str, str]:
    """Per change in the series: how this build has it (read from the patches' parts)."""
    parts: dict[str, set[str]] = {}
    for p in record["series"]["patches"]:
        parts.setdefault(p["change"], set()).add(p.get("part", "change"))
    states = {}
    for change, kinds in parts.items():
        if carries(kinds):
            extra = sorted(kinds - {"change"})
            states[change] = CARRIED + (f" (+ {', '.join(extra)})" if extra else "")
        else:
            states[change] = f"{', '.join(sorted(kinds))} only"
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
    base_findings: dict[str, Any] | None = None,
    known_issues: dict[str, dict[str, Any]] | None = None,
) -> str:
    """The notes; ``findings``/``base_findings``: the probes' findings (change -> Finding)
    on the built tree and on the pristine base; ``known_issues``: each entry of the
    known-issue register on the built tree (id -> state, reason, patches; None: not
    judged)."""
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
        *(
            [
                f"- **Binaries**: upstream's ROCm wheel `{base['upstream_wheel']['filename']}` "
                f"(sha256 `{base['upstream_wheel']['sha256']}`): {rocm['variant']}, ROCm "
                f"{rocm['rocm_version']}, {rocm['python']} only; AITER "
                f"{rocm.get('aiter') or 'not pinned by the base'} (the base's ROCm image)"
            ]
            if (rocm := build.get("rocm")) and base.get("upstream_wheel")
            else []
        ),
        f"- **Series**: revision {record['series']['revision']}, {len(patches)} patch(es)",
        "",
        "## Changes",
        "",
        "| change | state | fork patches | upstream PR |",
        "| --- | --- | --- | --- |",
    ]
    in_series = change_states(record)
    parts: dict[str, list[str]] = {}
    for patch in patches:
        parts.setdefault(patch["change"], []).append(patch.get("part", "change"))
    left_out = record["series"].get("left_out", [])
    absent = {p["change"] for p in left_out} - set(parts)
    for change in registry.changes():
        if change.id in absent:
            out.append(
                f"| {change.id}: {change.title} | {NOT_IN_BUILD} | none | "
                f"{change.pr_url or 'vendor change'} |"
            )
            continue
        found = (findings or {}).get(change.id)
        base_found = (base_findings or {}).get(change.id)
        if found is not None and base_found is not None:
            state = decide(base_found.state, parts.get(change.id, ()), patched=found.state)
            state += f" ({found.reason})"
        else:
            state = CARRIED if carries(parts.get(change.id, ())) else "not judged (no probes)"
        pr = prs.get(change.id, change.pr_url or "vendor change")
        out.append(
            f"| {change.id}: {change.title} | {state} | {in_series.get(change.id, 'none')} | {pr} |"
        )
    out += ["", "States: " + LEGEND.replace("\n", " ")]
    if left_out:
        out += [
            "",
            "## Not in this build",
            "",
            f"This {build['mode']} build left out the patches that only a full build can "
            "carry (`Fork-Build: full`); a full build of the same series has them:",
            "",
            *(f"- `{p['file']}` ({p['change']}): not in this build" for p in left_out),
        ]
    out += ["", "## Hardening items", ""]
    for change in registry.changes():
        if change.id in absent:
            continue
        found = (findings or {}).get(change.id)
        for item in change.hardening:
            mark = ""
            if not item.applies_at(base["version"]) or (
                found is not None and item.id in found.hardening_na
            ):
                mark = " (does not apply to this base)"
            elif found is not None:
                mark = (
                    " (in this build)" if found.hardening.get(item.id) else " (not in this build)"
                )
            out.append(f"- {change.id} / {item.id}: {item.description}{mark}")
    out += ["", "## Known upstream issues", ""]
    if known_issues is None:
        out.append("Not judged: the build's tree was not probed against known-issues.toml.")
    elif not known_issues:
        out.append("known-issues.toml lists none.")
    else:
        out += ["| known issue | state in this build | why |", "| --- | --- | --- |"]
        for issue_id, cell in known_issues.items():
            why = cell["reason"]
            if cell.get("patches"):
                why += " (" + ", ".join(f"`{p}`" for p in cell["patches"]) + ")"
            out.append(f"| {issue_id} | {cell['state']} | {why} |")
    out += ["", "## Patches", "", "| patch | change | part | sha256 |", "| --- | --- | --- | --- |"]
    for p in patches:
        out.append(
            f"| `{p['file']}` | {p['change']} | {p.get('part', 'change')} | `{p['sha256'][:16]}` |"
        )
    out += ["", "## Since the previous fork version", "", *_since(record, previous), ""]
    return "\n".join(out)
