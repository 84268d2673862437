"""Stand-in for the change probes: the interface only, every change reported absent.

The real probes (one module per change, recognising upstream's and the
fork's versions of each change) replace this package; ``status`` and the
test fixtures use only the names defined here.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

CHANGE_IDS: tuple[str, ...] = (
    "rope-cache-dtype",
    "rope-bf16-buffer",
    "moe-bias-precast",
    "dsv32-decode",
    "ar-rms-pack-gate",
)


class SourceTree(Protocol):
    def read_text(self, path: str) -> str | None: ...


class DirTree:
    """A checkout on disk."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def read_text(self, path: str) -> str | None:
        try:
            return (self.root / path).read_text(encoding="utf-8", errors="replace")
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return None


class GitTree:
    """A commit or tree of a git repository, read with ``git cat-file``."""

    def __init__(self, repo: Path, rev: str) -> None:
        self.repo = Path(repo)
        self.rev = rev

    def read_text(self, path: str) -> str | None:
        proc = subprocess.run(
            ["git", "--git-dir", str(self.repo), "cat-file", "blob", f"{self.rev}:{path}"],
            capture_output=True,
        )
        return proc.stdout.decode("utf-8", errors="replace") if proc.returncode == 0 else None


@dataclass(frozen=True)
class Finding:
    state: str  # "present" | "absent" | "n/a"
    reason: str
    hardening: dict[str, bool] = field(default_factory=dict)


def probe_all(tree: SourceTree) -> dict[str, Finding]:
    return {change: Finding("absent", "no probe installed") for change in CHANGE_IDS}
