"""Read-only views of a vLLM source tree: a checkout on disk or a git revision."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Protocol


class SourceTree(Protocol):
    """Anything that can return the text of a file by its tree-relative path."""

    def read_text(self, path: str) -> str | None:
        """Return the file's text, or None when the file is missing."""
        ...


def _clean(path: str) -> str:
    parts = [p for p in path.replace("\\", "/").split("/") if p not in ("", ".")]
    if not parts or ".." in parts:
        raise ValueError(f"not a path inside the tree: {path!r}")
    return "/".join(parts)


class DirTree:
    """A vLLM checkout on disk."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def read_text(self, path: str) -> str | None:
        target = self.root / _clean(path)
        try:
            return target.read_text(encoding="utf-8", errors="replace")
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return None

    def list_files(self, prefix: str) -> list[str]:
        """Tree-relative paths of every file under the folder ``prefix``, sorted."""
        base = self.root / _clean(prefix)
        if not base.is_dir():
            return []
        return sorted(p.relative_to(self.root).as_posix() for p in base.rglob("*") if p.is_file())

    def files_containing(self, prefix: str, text: str) -> list[str]:
        """The files of list_files(prefix) whose text contains ``text``."""
        return [p for p in self.list_files(prefix) if text in (self.read_text(p) or "")]

    def __repr__(self) -> str:
        return f"DirTree({str(self.root)!r})"


class GitTree:
    """A commit (or any tree-ish) of a git repository, read without a checkout."""

    def __init__(self, repo: Path, rev: str) -> None:
        self.repo = Path(repo)
        self.rev = rev
        self._cache: dict[str, str | None] = {}
        if not rev or rev.startswith("-"):
            raise ValueError(f"not a revision: {rev!r}")
        out = subprocess.run(
            ["git", "-C", str(self.repo), "rev-parse", "--verify", "--quiet", f"{rev}^{{tree}}"],
            capture_output=True,
            text=True,
        )
        if out.returncode != 0:
            raise ValueError(f"{rev!r} is not a commit or tree in {self.repo}")
        self._tree = out.stdout.strip()

    def read_text(self, path: str) -> str | None:
        key = _clean(path)
        if key not in self._cache:
            self._cache[key] = self._read(key)
        return self._cache[key]

    def list_files(self, prefix: str) -> list[str]:
        """Tree-relative paths of every file under the folder ``prefix``, sorted."""
        out = subprocess.run(
            ["git", "-C", str(self.repo), "ls-tree", "-r", "--name-only", "-z", self._tree, "--"]
            + [_clean(prefix) + "/"],
            capture_output=True,
            text=True,
        )
        if out.returncode != 0:
            return []
        return sorted(name for name in out.stdout.split("\0") if name)

    def files_containing(self, prefix: str, text: str) -> list[str]:
        """The files of list_files(prefix) whose text contains ``text`` (git grep)."""
        out = subprocess.run(
            ["git", "-C", str(self.repo), "grep", "-l", "-z", "-F", "-e", text, self._tree, "--"]
            + [_clean(prefix) + "/"],
            capture_output=True,
            text=True,
        )
        if out.returncode not in (0, 1):
            return []
        return sorted(n.partition(":")[2] for n in out.stdout.split("\0") if n)

    def _read(self, path: str) -> str | None:
        spec = f"{self._tree}:{path}"
        kind = subprocess.run(
            ["git", "-C", str(self.repo), "cat-file", "-t", spec],
            capture_output=True,
            text=True,
        )
        if kind.returncode != 0 or kind.stdout.strip() != "blob":
            return None
        blob = subprocess.run(
            ["git", "-C", str(self.repo), "cat-file", "blob", spec],
            capture_output=True,
        )
        if blob.returncode != 0:
            return None
        return blob.stdout.decode("utf-8", errors="replace")

    def __repr__(self) -> str:
        return f"GitTree({str(self.repo)!r}, {self.rev!r})"
