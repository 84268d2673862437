"""The result of probing one change in one source tree."""

from __future__ import annotations

from dataclasses import dataclass, field

PRESENT = "present"
ABSENT = "absent"
NA = "n/a"
STATES = (PRESENT, ABSENT, NA)

# Hardening items per change, in a stable order (keys of Finding.hardening).
HARDENING: dict[str, tuple[str, ...]] = {
    "rope-cache-dtype": ("python-dtype-check", "bounded-dispatch"),
    "rope-bf16-buffer": ("buffer-dtype-check", "no-unusable-buffer", "recompute-consistent"),
    "moe-bias-precast": (),
    "dsv32-decode": (
        "complete-metadata-key",
        "no-reuse-without-host-seqlens",
        "bias-precision-guard",
    ),
    "ar-rms-pack-gate": ("two-stage-switch",),
}


def no_hardening(change_id: str) -> dict[str, bool]:
    """Every hardening item of a change, none found (for early returns)."""
    return dict.fromkeys(HARDENING[change_id], False)


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
