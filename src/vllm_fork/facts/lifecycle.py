"""Patch lifecycle: whether a carried patch is ready to retire, and the evidence.

The registry says why each change is carried and when it retires
(``Change.why``, ``Change.retire_when``); its probe says whether an upstream
tree has the change. This module is the one rule joining the two, used by
``status`` (per base, per patch) and by the rebase (a conflicting patch that
upstream made redundant is proposed for ``--skip`` instead of failing):

- a ``Fork-Part: change`` patch is retire-ready once the probe finds the
  change in a pristine upstream release;
- a ``hardening`` patch once, in addition, the probe finds every hardening
  item of the change in that release;
- ``tests`` and ``support`` patches have no probe of their own: carried.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vllm_fork.facts import registry
from vllm_fork.facts.finding import PRESENT
from vllm_fork.facts.state import PART_CHANGE, PART_HARDENING

CARRIED = "carried"
RETIRE_READY = "retire-ready"


@dataclass(frozen=True)
class Retirement:
    """Evidence that upstream ``release`` has what a patch brings."""

    release: str
    probe: str  # the probe's one-line finding on that release

    def evidence(self) -> str:
        return f"upstream {self.release} has it (probe: {self.probe})"

    def to_json(self) -> dict[str, str]:
        return {"release": self.release, "probe": self.probe}


def retirement(
    change_id: str,
    part: str,
    state: str,
    reason: str,
    hardening: Mapping[str, bool] | None,
    release: str,
) -> Retirement | None:
    """The evidence that a patch (``change_id``, ``part``) can retire, given the
    probe's ``state``/``reason``/``hardening`` on pristine upstream ``release``;
    None while it is still needed."""
    change = registry.find(change_id)
    if change is None or state != PRESENT:
        return None
    if part == PART_CHANGE:
        return Retirement(release, reason)
    ids = change.hardening_ids
    if part == PART_HARDENING and ids and hardening and all(hardening.get(h) for h in ids):
        return Retirement(release, f"{reason}; hardening {', '.join(ids)} present")
    return None


@dataclass(frozen=True)
class PatchLife:
    """Where one patch of a series stands: carried, or retire-ready with evidence."""

    patch: str
    change: str
    part: str
    retire: Retirement | None

    @property
    def state(self) -> str:
        return RETIRE_READY if self.retire else CARRIED

    @property
    def why(self) -> str:
        change = registry.find(self.change)
        return change.why if change else ""

    @property
    def retire_when(self) -> str:
        change = registry.find(self.change)
        return change.retire_when if change else ""

    def to_json(self) -> dict[str, Any]:
        return {
            "patch": self.patch,
            "change": self.change,
            "part": self.part,
            "state": self.state,
            "why": self.why,
            "retire_when": self.retire_when,
            "evidence": self.retire.to_json() if self.retire else None,
        }
