"""The on-disk state of a rebase in progress: ``.git/vllm-fork-rebase.json``.

The file is written before every step that changes the work tree or a ref
(write to a temporary file, fsync, rename, fsync the directory), so a
rebase interrupted at any point, even by a crash, can be continued or
aborted from what it says.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from vllm_fork.errors import WorkTreeError

STATE_FILE = "vllm-fork-rebase.json"
SCHEMA = 1

# Phases, in order. ``conflict`` is ``picking`` stopped for the user.
IMPORTING = "importing"
PICKING = "picking"
CONFLICT = "conflict"
FINISHING = "finishing"
PHASES = (IMPORTING, PICKING, CONFLICT, FINISHING)

# Per-patch results.
APPLIED = "applied"
ABSORBED = "absorbed"
# Detail of a patch dropped with --skip: the user's call, not the probes' or
# an empty pick's, so the old series gets no Applied-Upstream trailer for it.
SKIPPED = "dropped by hand (--skip)"


@dataclass
class Pick:
    """One commit of the old series, and what became of it."""

    commit: str
    subject: str
    change: str
    part: str
    result: str = ""  # "" (not yet), APPLIED or ABSORBED
    detail: str = ""
    new_commit: str = ""
    reason: str = ""  # why it was dropped by hand (--skip --reason)
    retire: dict[str, str] | None = None  # lifecycle evidence that upstream has it


@dataclass
class RebaseState:
    from_version: str
    onto_version: str
    branch: str
    orig_head: str
    # Every ref the rebase may change, with its value before (None: did not exist).
    orig_refs: dict[str, str | None]
    orig_base: str
    backup_ref: str
    series_dir: str
    old_series_dir: str
    picks: list[Pick]
    phase: str = IMPORTING
    upstream_commit: str = ""
    next: int = 0
    expect_head: str = ""
    conflict: list[dict[str, Any]] = field(default_factory=list)
    # Series files as they were before the rebase wrote any (see rebase.py), for --abort.
    files_before: dict[str, str | None] | None = None
    # Where to write the review besides .git/vllm-fork/ (--review FILE); "" for none.
    review_path: str = ""
    schema: int = SCHEMA

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RebaseState:
        if data.get("schema") != SCHEMA:
            raise ValueError(f"unknown schema {data.get('schema')!r}")
        data = dict(data)
        data["picks"] = [Pick(**p) for p in data["picks"]]
        state = cls(**data)
        if state.phase not in PHASES:
            raise ValueError(f"unknown phase {state.phase!r}")
        return state


def state_path(git_dir: Path) -> Path:
    return git_dir / STATE_FILE


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_state(git_dir: Path, state: RebaseState) -> None:
    """Replace the state file atomically (never leaves a half-written file)."""
    path = state_path(git_dir)
    tmp = path.with_name(path.name + ".tmp")
    data = json.dumps(state.to_json(), indent=1, sort_keys=True) + "\n"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    _fsync_dir(git_dir)


def load_state(git_dir: Path) -> RebaseState | None:
    """The state of the rebase in progress, or None when there is none."""
    path = state_path(git_dir)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    try:
        return RebaseState.from_json(json.loads(text))
    except (ValueError, TypeError, KeyError) as exc:
        raise WorkTreeError(
            f"{path} is unreadable ({exc}); the pre-rebase state is kept in the "
            "refs/vllm-fork/pre-rebase/* refs: inspect them, then remove the file"
        ) from None


def clear_state(git_dir: Path) -> None:
    state_path(git_dir).unlink(missing_ok=True)
    state_path(git_dir).with_name(STATE_FILE + ".tmp").unlink(missing_ok=True)
    _fsync_dir(git_dir)
