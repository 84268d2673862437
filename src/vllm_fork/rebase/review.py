"""The review of a rebase: what became of each patch, as Markdown and JSON.

Per patch of the old series:

- ``unchanged``: re-applied, and ``git range-diff`` finds the new commit
  equal to the old one;
- ``changed``: re-applied with a different diff; the review carries the
  interdiff (``git range-diff`` of the old commit against the new one);
- ``absorbed``: upstream V2 has it (the probe found it, or the 3-way merge
  left nothing to change), with the release and the evidence;
- ``dropped``: dropped by hand with ``--skip``, with the reason given
  (``--reason``) or marked "reason missing".

It also lists each file the old series touches that upstream moved, renamed
or removed between V1 and V2 (git's rename detection between the two
upstream trees), and where each patch touching it went.

``build_review`` reads a work tree whose rebase has replayed every patch (its
state still loaded); ``write_review`` writes ``review.md`` and
``review.json`` into ``<git dir>/vllm-fork/`` and, if asked, to a file of the
user's. ``vllm-fork rebase`` calls both when it finishes; other commands that
rebase (``update``) call ``review_rebase`` with a finished result's state.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from vllm_fork.facts.names import tag_for
from vllm_fork.git import run_git
from vllm_fork.rebase.state import ABSORBED, APPLIED, SKIPPED, RebaseState
from vllm_fork.tree.commits import read_commits

log = logging.getLogger(__name__)

UNCHANGED = "unchanged"
CHANGED = "changed"
ABSORBED_UPSTREAM = "absorbed"
DROPPED = "dropped"
OUTCOMES = (UNCHANGED, CHANGED, ABSORBED_UPSTREAM, DROPPED)
REASON_MISSING = "reason missing"
REVIEW_DIR = "vllm-fork"
SCHEMA = 1


@dataclass
class PatchReview:
    number: int
    patch: str  # file name in the old series (or the subject when unknown)
    subject: str
    change: str
    part: str
    outcome: str
    detail: str  # how the pick went ("clean", "3-way merge", the probe's finding...)
    old_commit: str
    new_commit: str = ""
    release: str = ""  # absorbed: the upstream release that has it
    evidence: str = ""  # absorbed: what shows it; dropped: the lifecycle evidence, if any
    reason: str = ""  # dropped: why (REASON_MISSING when none was given)
    interdiff: str = ""  # changed: git range-diff of the old commit against the new one
    headers_only: bool = False  # changed: only hunk headers differ (upstream moved code around)


@dataclass
class MovedFile:
    old_path: str  # in upstream V1
    new_path: str | None  # in upstream V2; None: upstream removed it
    similarity: int | None  # git's rename score (percent)
    patches: list[dict[str, str]] = field(default_factory=list)  # patch, where it went


@dataclass
class Review:
    from_version: str
    onto_version: str
    branch: str
    before: str  # the pre-rebase ref
    head: str
    patches: list[PatchReview]
    moved: list[MovedFile]
    schema: int = SCHEMA

    def counts(self) -> dict[str, int]:
        return {o: sum(p.outcome == o for p in self.patches) for o in OUTCOMES}

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["counts"] = self.counts()
        return data


# --- building ----------------------------------------------------------------------


def _git(tree: Path, args: list[str]) -> str:
    return run_git(args, cwd=tree).stdout.decode(errors="replace")


def interdiff(tree: Path, old: str, new: str) -> tuple[bool, str]:
    """(same, text): ``git range-diff`` of one old commit against one new one.

    A high creation factor makes git always pair the two commits, so a patch
    that changed a lot still shows as a diff of diffs, not as a rewrite."""
    out = _git(
        tree,
        [
            "range-diff",
            "--no-color",
            "--creation-factor=999",
            f"{old}^..{old}",
            f"{new}^..{new}",
        ],
    )
    first = out.splitlines()[0] if out else ""
    same = " = " in first
    body = "\n".join(out.splitlines()[1:]).rstrip()
    return same, body


def only_hunk_headers(diff: str) -> bool:
    """Whether a range-diff body changes nothing but hunk headers (``@@`` lines)."""
    changed = [line[5:] for line in diff.splitlines() if line[4:5] in ("-", "+")]
    return bool(changed) and all(line.startswith("@@") for line in changed)


def upstream_moves(tree: Path, old_tag: str, new_rev: str, paths: set[str]) -> list[MovedFile]:
    """Files among ``paths`` that upstream renamed or removed between the two trees."""
    out = _git(tree, ["diff", "--no-color", "-M", "-l0", "--name-status", "-z", old_tag, new_rev])
    tokens = out.split("\0")
    moved: list[MovedFile] = []
    i = 0
    while i < len(tokens) and tokens[i]:
        status = tokens[i]
        if status.startswith(("R", "C")):
            old, new = tokens[i + 1], tokens[i + 2]
            i += 3
            if status.startswith("R") and old in paths:
                moved.append(MovedFile(old, new, int(status[1:] or 0)))
        else:
            path = tokens[i + 1]
            i += 2
            if status == "D" and path in paths:
                moved.append(MovedFile(path, None, None))
    return sorted(moved, key=lambda m: m.old_path)


def _outcome(tree: Path, state: RebaseState, number: int, names: dict[str, str]) -> PatchReview:
    p = state.picks[number - 1]
    review = PatchReview(
        number=number,
        patch=names.get(p.subject, p.subject),
        subject=p.subject,
        change=p.change,
        part=p.part,
        outcome=ABSORBED_UPSTREAM,
        detail=p.detail,
        old_commit=p.commit,
        new_commit=p.new_commit,
    )
    if p.result == APPLIED:
        same, diff = interdiff(tree, p.commit, p.new_commit)
        review.outcome = UNCHANGED if same else CHANGED
        review.interdiff = "" if same else diff
        review.headers_only = not same and only_hunk_headers(diff)
    elif p.result == ABSORBED and p.detail == SKIPPED:
        review.outcome = DROPPED
        review.reason = p.reason or REASON_MISSING
        if p.retire:
            review.evidence = f"upstream {p.retire['release']} has it (probe: {p.retire['probe']})"
    elif p.result == ABSORBED:
        review.release = state.onto_version
        found = f"upstream {state.onto_version} has it: "
        review.evidence = (
            f"probe: {p.detail.removeprefix(found)}" if p.detail.startswith(found) else p.detail
        )
    else:
        raise ValueError(f"patch {number} ({p.subject}) was not replayed yet")
    return review


def _where(tree: Path, review: PatchReview, moved: MovedFile) -> str:
    if review.outcome == DROPPED:
        return f"dropped by hand ({review.reason})"
    if review.outcome == ABSORBED_UPSTREAM:
        return f"absorbed by upstream {review.release} ({review.evidence})"
    new_paths = read_commits(tree, [review.new_commit])[0].paths()
    if moved.new_path and moved.new_path in new_paths:
        return f"follows the file to {moved.new_path}"
    if moved.old_path in new_paths:
        return f"re-creates {moved.old_path} (upstream no longer has it there)"
    return "no longer touches it (now: " + ", ".join(new_paths) + ")"


def build_review(tree: Path, state: RebaseState, names: dict[str, str]) -> Review:
    """The review of a rebase whose every patch has been replayed (``state``);
    ``names``: subject -> patch file name of the old series."""
    reviews = [_outcome(tree, state, n, names) for n in range(1, len(state.picks) + 1)]
    old = {c.sha: c for c in read_commits(tree, [p.commit for p in state.picks])}
    touched: dict[str, list[PatchReview]] = {}
    for review in reviews:
        for path in old[review.old_commit].paths():
            touched.setdefault(path, []).append(review)
    moved = upstream_moves(
        tree, f"refs/tags/{tag_for(state.from_version)}", state.upstream_commit, set(touched)
    )
    for entry in moved:
        entry.patches = [
            {"patch": r.patch, "went": _where(tree, r, entry)} for r in touched[entry.old_path]
        ]
    head = run_git(["rev-parse", "HEAD"], cwd=tree).stdout.decode().strip()
    return Review(
        from_version=state.from_version,
        onto_version=state.onto_version,
        branch=state.branch.removeprefix("refs/heads/"),
        before=state.backup_ref,
        head=head,
        patches=reviews,
        moved=moved,
    )


# --- rendering ---------------------------------------------------------------------


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _fence(text: str) -> str:
    ticks = "```"
    while ticks in text:
        ticks += "`"
    return f"{ticks}diff\n{text}\n{ticks}"


def render_markdown(review: Review) -> str:
    counts = review.counts()
    v1, v2 = review.from_version, review.onto_version
    lines = [
        f"# Rebase review: vLLM {v1} -> {v2}",
        "",
        f"{len(review.patches)} patch(es) of series/{v1}: "
        + ", ".join(f"{counts[o]} {o}" for o in OUTCOMES)
        + ".",
        f"Branch `{review.branch}` is now at `{review.head[:12]}` on upstream {v2} "
        f"(before: `{review.before}`).",
        "",
        "| # | patch | change | part | outcome |",
        "|---|---|---|---|---|",
    ]
    for p in review.patches:
        outcome = p.outcome
        if p.outcome == ABSORBED_UPSTREAM:
            outcome += f" by upstream {p.release}"
        elif p.outcome == DROPPED:
            outcome += f" by hand: {p.reason}"
        elif p.outcome == CHANGED and p.headers_only:
            outcome += f" ({p.detail}; only hunk headers: upstream moved the code around it)"
        elif p.outcome == CHANGED:
            outcome += f" ({p.detail}; interdiff below)"
        else:
            outcome += f" ({p.detail})"
        lines.append(
            f"| {p.number} | `{_cell(p.patch)}` | {p.change or '?'} | {p.part or '?'} | "
            f"{_cell(outcome)} |"
        )
    lines += ["", f"## Files upstream moved or removed under the series ({v1} -> {v2})", ""]
    if review.moved:
        lines += ["| upstream " + v1 + " | upstream " + v2 + " | patch | where it went |"]
        lines += ["|---|---|---|---|"]
        for m in review.moved:
            new = f"`{m.new_path}` ({m.similarity}% similar)" if m.new_path else "removed"
            for entry in m.patches:
                lines.append(
                    f"| `{m.old_path}` | {new} | `{_cell(entry['patch'])}` | "
                    f"{_cell(entry['went'])} |"
                )
    else:
        lines.append("None: every file the series touches kept its path.")
    absorbed = [p for p in review.patches if p.outcome == ABSORBED_UPSTREAM]
    if absorbed:
        lines += ["", "## Absorbed by upstream", ""]
        for p in absorbed:
            lines.append(
                f"- `{p.patch}` ({p.change}, {p.part}): upstream {p.release} has it; {p.evidence}"
            )
    dropped = [p for p in review.patches if p.outcome == DROPPED]
    if dropped:
        lines += ["", "## Dropped by hand", ""]
        for p in dropped:
            line = f"- `{p.patch}` ({p.change}, {p.part}): "
            if p.reason == REASON_MISSING:
                line += (
                    f"**{REASON_MISSING}**: say why before this review is approved "
                    "(`vllm-fork rebase --skip --reason TEXT` records it)"
                )
            else:
                line += f"reason: {p.reason}"
            if p.evidence:
                line += f"; lifecycle: {p.evidence}"
            lines.append(line)
    changed = [p for p in review.patches if p.outcome == CHANGED]
    if changed:
        lines += ["", "## Changed patches (interdiff: old patch -> new patch)"]
        for p in changed:
            lines += [
                "",
                f"### {p.number}. `{p.patch}`",
                "",
                f"{p.change}, {p.part}; replayed: {p.detail}; "
                f"`{p.old_commit[:12]}` -> `{p.new_commit[:12]}`",
                "",
                _fence(p.interdiff),
            ]
    return "\n".join(lines) + "\n"


def write_review(review: Review, git_dir: Path, extra: Path | None = None) -> list[Path]:
    """Write review.md and review.json into ``<git_dir>/vllm-fork/``, and to
    ``extra`` (Markdown; its JSON beside it with the suffix .json) if given."""
    markdown = render_markdown(review)
    data = json.dumps(review.to_json(), indent=2, sort_keys=True) + "\n"
    targets = [git_dir / REVIEW_DIR / "review.md"]
    if extra is not None:
        targets.append(extra.with_suffix(".md") if extra.suffix == ".json" else extra)
    written: list[Path] = []
    for md in targets:
        md.parent.mkdir(parents=True, exist_ok=True)
        js = md.with_suffix(".json")
        md.write_text(markdown, encoding="utf-8")
        js.write_text(data, encoding="utf-8")
        written += [md, js]
    return written


def review_rebase(
    tree: Path, git_dir: Path, state: RebaseState, names: dict[str, str], extra: Path | None
) -> list[Path]:
    """Build and write the review of a rebase (for commands that drive one)."""
    return write_review(build_review(tree, state, names), git_dir, extra)
