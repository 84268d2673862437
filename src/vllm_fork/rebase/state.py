"""The on-disk state of a rebase in progress: ``.git/vllm-fork-rebase.json``.

The file is written before every step that changes the work tree or a ref
(vllm_fork.transaction's StateFile: whole or not at all), so a
rebase interrupted at any point, even by a crash, can be continued or
aborted from what it says.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from vllm_fork.errors import WorkTreeError
from vllm_fork.transaction import StateFile, StateUnreadable

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
# an empty pick's (the review says "dropped by hand", not "absorbed").
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


def _state(git_dir: Path) -> StateFile:
    # strict: the state guards the user's work; an unreadable one is never dropped
    return StateFile(state_path(git_dir), SCHEMA, what="rebase state", strict=True, indent=1)


def save_state(git_dir: Path, state: RebaseState) -> None:
    """Replace the state file atomically (never leaves a half-written file)."""
    _state(git_dir).save(state.to_json())


def load_state(git_dir: Path) -> RebaseState | None:
    """The state of the rebase in progress, or None when there is none."""
    try:
        data = _state(git_dir).load()
        return None if data is None else RebaseState.from_json(data)
    except (StateUnreadable, ValueError, TypeError, KeyError) as exc:
        raise WorkTreeError(
            f"{state_path(git_dir)} is unreadable ({exc}); the pre-rebase state is kept in "
            "the refs/vllm-fork/pre-rebase/* refs: inspect them, then remove the file"
        ) from None


def clear_state(git_dir: Path) -> None:
    _state(git_dir).clear()
