"""The result of probing one change in one source tree."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

PRESENT = "present"
ABSENT = "absent"
NA = "n/a"
# A local change (local-changes.toml) has no probe: its patches say whether it is there.
UNPROBED = "unprobed"
STATES = (PRESENT, ABSENT, NA, UNPROBED)


@dataclass(frozen=True)
class Finding:
    state: str  # "present" | "absent" | "n/a" | "unprobed" (a local change)
    reason: str  # one line: what was found / why n/a
    hardening: dict[str, bool] = field(default_factory=dict)
    # hardening items whose code this tree does not have (left out of the count)
    hardening_na: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if self.state not in STATES:
            raise ValueError(f"unknown state {self.state!r}")
        if "\n" in self.reason:
            raise ValueError("reason must be one line")

    def to_json(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "reason": self.reason,
            "hardening": dict(self.hardening),
            "hardening_na": sorted(self.hardening_na),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Finding:
        return cls(
            data["state"],
            data["reason"],
            dict(data.get("hardening", {})),
            frozenset(data.get("hardening_na", ())),
        )
