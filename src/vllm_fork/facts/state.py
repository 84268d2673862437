"""Where a change stands on a base: the one rule every command applies.

- ``upstream``: the pristine base has it (its patches, if any, are hardening
  or tests on top);
- ``n/a``: the pristine base lacks the code the change modifies, or (a local
  change, which has no probe) the base's series has no patch of it: it was
  never meant for that base;
- ``missing``: no ``Fork-Part: change`` patch brings it, or one does and the
  probe of base + series still does not find it;
- ``conflict``: a patch of it does not apply (only where the series is
  applied patch by patch, as ``matrix`` does);
- ``carried``: a ``change`` patch brings it (and, where the patched tree is
  probed, the probe finds it).

Patch parts: only a ``change`` patch makes a change carried; the tests of
``change``, ``hardening`` and ``fix`` patches must fail without the patch
(what ``vllm-fork test --prove-fail`` judges); a ``fix`` patch backports an
upstream fix of a later bug in the change's code (it credits that fix's PR
and authors, not the change's); ``tests`` patches pin what upstream already
has; ``support`` patches carry infrastructure.
"""

from __future__ import annotations

from collections.abc import Iterable

from vllm_fork.facts.finding import NA as PROBE_NA
from vllm_fork.facts.finding import PRESENT, UNPROBED

UPSTREAM = "upstream"
CARRIED = "carried"
NA = "n/a"
MISSING = "missing"
CONFLICT = "conflict"
STATES = (CARRIED, UPSTREAM, NA, CONFLICT, MISSING)

PART_CHANGE = "change"
PART_HARDENING = "hardening"
PART_TESTS = "tests"
PART_SUPPORT = "support"
PART_FIX = "fix"
PARTS = (PART_CHANGE, PART_HARDENING, PART_TESTS, PART_SUPPORT, PART_FIX)
# their tests must fail without them
JUDGED_PARTS = (PART_CHANGE, PART_HARDENING, PART_FIX)

# the reason shown for a local change on a base where it has no patch
NA_LOCAL = "a local change with no patch on this base"

LEGEND = (
    "carried: the series brings it; upstream: the release has it; n/a: the release "
    "lacks the code it changes (a local change: no patch of it there);\n"
    "conflict: a patch of it does not apply; missing: neither upstream nor the series has it."
)


def carries(parts: Iterable[str]) -> bool:
    """Whether patches of these parts bring the change itself."""
    return PART_CHANGE in parts


def decide(
    base: str, parts: Iterable[str], *, patched: str | None = None, failed: bool = False
) -> str:
    """The state of one change.

    ``base``: the probe's state on the pristine base; ``parts``: the
    ``Fork-Part`` of each of the change's patches; ``patched``: the probe's
    state on base + series, when that tree was probed; ``failed``: a patch of
    the change did not apply.
    """
    if base == PRESENT:
        return UPSTREAM
    if base == PROBE_NA:
        return NA
    parts = list(parts)
    if base == UNPROBED and not parts:
        # a local change has no probe: where no patch of it is, it is not meant to be
        return NA
    if not carries(parts):
        # Tests, hardening or support without the change itself: the base
        # still lacks it (e.g. a series that only pins upstream behaviour).
        return MISSING
    if failed:
        return CONFLICT
    # a local change has no probe: carried when its change patch is there
    if patched is not None and patched not in (PRESENT, UNPROBED):
        return MISSING
    return CARRIED
