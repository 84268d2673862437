"""The result of probing one change in one source tree."""

from __future__ import annotations

from dataclasses import dataclass, field

PRESENT = "present"
ABSENT = "absent"
NA = "n/a"
STATES = (PRESENT, ABSENT, NA)


@dataclass(frozen=True)
class Finding:
    state: str  # "present" | "absent" | "n/a"
    reason: str  # one line: what was found / why n/a
    hardening: dict[str, bool] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.state not in STATES:
            raise ValueError(f"unknown state {self.state!r}")
        if "\n" in self.reason:
            raise ValueError("reason must be one line")
