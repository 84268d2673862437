"""The fork's wheel version: ``<base>+hardened.<N>``.

``N`` is the series revision. It is read from ``series/<V>/revision`` (one
integer; maintainers bump it whenever the series' content changes, so two
different series never share a version); a series without that file uses
its number of patches. The label is a PEP 440 local version and never
contains ``cpu`` (vLLM's platform detection reads that word in its version).
"""

from __future__ import annotations

import re
from pathlib import Path

from packaging.version import InvalidVersion, Version

from vllm_fork.errors import SeriesError

REVISION_FILE = "revision"
LABEL = "hardened"
_LABEL_RE = re.compile(rf"^(?P<base>[0-9][0-9A-Za-z.]*)\+{LABEL}\.(?P<rev>[0-9]+)$")


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


def fork_version(base_version: str, revision: int) -> str:
    """``<base>+hardened.<revision>``, checked to be a valid PEP 440 version."""
    if revision < 0:
        raise SeriesError(f"series revision must be >= 0, got {revision}")
    base = Version(base_version)
    if base.local is not None:
        raise SeriesError(f"base version {base_version} already has a local label")
    text = f"{base}+{LABEL}.{revision}"
    check_fork_version(text)
    return text


def check_fork_version(text: str) -> tuple[str, int]:
    """Parse a fork version into (base, revision); raise SeriesError when malformed."""
    m = _LABEL_RE.match(text)
    if not m or "cpu" in text.lower():
        raise SeriesError(f"{text!r} is not a fork version of the form <base>+{LABEL}.<N>")
    try:
        if str(Version(text)) != text:
            raise InvalidVersion(text)
    except InvalidVersion:
        raise SeriesError(f"{text!r} is not a normalized PEP 440 version") from None
    return m.group("base"), int(m.group("rev"))
