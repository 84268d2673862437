"""Which patches a precompiled build cannot honour.

A precompiled build takes vLLM's compiled extensions (and a few vendored
Python packages) from upstream's wheel of the same version. A patch that
changes a file compiled into those binaries, or a path the build overwrites
from the wheel, would silently be dropped from the result, so such a series
must be built with ``--mode full`` on a build host.

A patch marked ``Fork-Build: full`` is the exception: a precompiled build
leaves it out (the build tree is materialized without it) and says so in the
wheel's version label and provenance record, instead of refusing the series.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from vllm_fork.diffs import touched_paths
from vllm_fork.series.patches import PatchHeader, Series

# Sources compiled into the upstream binaries.
COMPILED_PREFIXES = ("csrc/", "cmake/")
COMPILED_FILES = ("CMakeLists.txt",)
# Paths vLLM's precompiled mode overwrites with the upstream wheel's copy. The
# one list: export refuses a series that changes them, whatever the build mode.
OVERWRITTEN_PREFIXES = ("vllm/vllm_flash_attn/", "vllm/third_party/")


def precompiled_reason(path: str) -> str | None:
    """Why a precompiled build cannot carry a change to ``path`` (None: it can)."""
    if path.startswith(COMPILED_PREFIXES) or path in COMPILED_FILES:
        return "compiled into upstream's binaries"
    if path.startswith(OVERWRITTEN_PREFIXES):
        return "overwritten from upstream's wheel by the precompiled build"
    return None


def left_out_of(series: Series, mode: str) -> tuple[PatchHeader, ...]:
    """The patches a build of ``mode`` leaves out: those marked ``Fork-Build: full``
    in a precompiled build, none otherwise."""
    return series.full_build_only() if mode == "precompiled" else ()


@dataclass(frozen=True)
class Conflict:
    patch: str
    path: str
    reason: str


def precompiled_conflicts(patches: Iterable[Path]) -> list[Conflict]:
    """Each (patch, path) of the series that a precompiled build would lose."""
    found: list[Conflict] = []
    for patch in patches:
        text = Path(patch).read_text(encoding="utf-8", errors="replace")
        for path in touched_paths(text, Path(patch).name):
            reason = precompiled_reason(path)
            if reason:
                found.append(Conflict(Path(patch).name, path, reason))
    return found


def refusal_message(version: str, conflicts: list[Conflict]) -> str:
    lines = [
        f"cannot build vLLM {version} in precompiled mode: the series changes files that "
        "upstream's binaries provide, and the wheel would silently lack these changes:"
    ]
    for c in conflicts:
        lines.append(f"  {c.patch}: {c.path} ({c.reason})")
    lines.append(
        "Build this series with `vllm-fork build --mode full --device cuda|rocm` on a build "
        "host with the GPU toolchain (or in a container from docker/Dockerfile.rocm). "
        "A patch whose change only a full build can carry, and that no other patch needs, "
        "may instead be marked `Fork-Build: full` (docs/series-format.md)."
    )
    return "\n".join(lines)
