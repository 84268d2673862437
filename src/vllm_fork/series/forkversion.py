"""The fork's wheel version: ``<base>+hardened.<N>`` (``<base>+hardened.<N>.nofull``).

``N`` is the series revision. It is read from ``series/<V>/revision`` (one
integer; maintainers bump it whenever the series' content changes, so two
different series never share a version); a series without that file uses
its number of patches. The label is a PEP 440 local version and never
contains ``cpu`` (vLLM's platform detection reads that word in its version).

A build that leaves out patches marked ``Fork-Build: full`` (a precompiled
build of a series that has them) ends its label with ``.nofull``: the wheel
says by its name that it lacks a change of its series revision. A build on
upstream's ROCm wheel names its ROCm variant before that
(``0.21.0+hardened.6.rocm700.nofull``). This module is the one place that
forms and parses labels.
"""

from __future__ import annotations

import re
from pathlib import Path

from packaging.version import InvalidVersion, Version

from vllm_fork.errors import SeriesError

REVISION_FILE = "revision"
LABEL = "hardened"
NOFULL = "nofull"
_LABEL_RE = re.compile(
    rf"^(?P<base>[0-9][0-9A-Za-z.]*)\+{LABEL}\.(?P<rev>[0-9]+)"
    rf"(?:\.(?P<rocm>rocm[0-9]{{3,}}))?(?P<nofull>\.{NOFULL})?$"
)


def series_revision(series_dir: Path, n_patches: int) -> int:
    """The revision ``N`` of a base's series (see the module docstring)."""
    path = Path(series_dir) / REVISION_FILE
    if not path.is_file():
        return n_patches
    values = [line.split("#", 1)[0].strip() for line in path.read_text().splitlines()]
    values = [v for v in values if v]
    if len(values) != 1 or not values[0].isdigit():
        raise SeriesError(f"{path}: must hold one non-negative integer (the series revision)")
    return int(values[0])


def fork_version(
    base_version: str, revision: int, *, left_out: bool = False, rocm: str | None = None
) -> str:
    """``<base>+hardened.<revision>``, checked to be a valid PEP 440 version;
    ``left_out``: the build leaves out ``Fork-Build: full`` patches (``.nofull``);
    ``rocm``: the ROCm variant of the upstream wheel the build reuses (``.rocm700``)."""
    if revision < 0:
        raise SeriesError(f"series revision must be >= 0, got {revision}")
    base = Version(base_version)
    if base.local is not None:
        raise SeriesError(f"base version {base_version} already has a local label")
    text = (
        f"{base}+{LABEL}.{revision}"
        + (f".{rocm}" if rocm else "")
        + (f".{NOFULL}" if left_out else "")
    )
    check_fork_version(text)
    return text


def check_fork_version(text: str) -> tuple[str, int]:
    """Parse a fork version into (base, revision); raise SeriesError when malformed."""
    m = _LABEL_RE.match(text)
    if not m or "cpu" in text.lower():
        raise SeriesError(
            f"{text!r} is not a fork version of the form <base>+{LABEL}.<N>[.rocmNNN][.{NOFULL}]"
        )
    try:
        if str(Version(text)) != text:
            raise InvalidVersion(text)
    except InvalidVersion:
        raise SeriesError(f"{text!r} is not a normalized PEP 440 version") from None
    return m.group("base"), int(m.group("rev"))


def leaves_out(text: str) -> bool:
    """Whether the fork version ``text`` says its build left out full-build-only patches."""
    m = _LABEL_RE.match(text)
    return bool(m and m.group("nofull"))


def rocm_variant(text: str) -> str | None:
    """The ROCm variant a fork version names (``rocm700``), or None."""
    m = _LABEL_RE.match(text)
    return m.group("rocm") if m else None
