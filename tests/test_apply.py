"""tree/apply.py: exact and 3-way applies without a work tree, and its error parser."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from vllm_fork.tree.apply import (
    CLEAN,
    CONFLICT,
    EMPTY,
    MERGED,
    ApplyError,
    SeriesApplyError,
    applier,
    apply_problems,
    tree_of,
)

from .gitutil import IDENTITY

LINES = "".join(f"line {i}\n" for i in range(1, 21))


def _git(repo: Path, *args: str, input: str | None = None) -> str:
    return subprocess.run(
        ["git", *args],
        cwd=repo,
        check=True,
        capture_output=True,
        text=True,
        input=input,
        env={**os.environ, **IDENTITY},
    ).stdout.strip()


def _commit(repo: Path, files: dict[str, str | None], message: str) -> str:
    for rel, text in files.items():
        path = repo / rel
        if text is None:
            _git(repo, "rm", "-q", rel)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        _git(repo, "add", rel)
    _git(repo, "commit", "-q", "-m", message)
    return _git(repo, "rev-parse", "HEAD")


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    _commit(repo, {"csrc/kernel.cu": LINES, "vllm/a.py": LINES}, "base")
    _git(repo, "tag", "base")
    return repo


def _patch(repo: Path, files: dict[str, str]) -> tuple[Path, str, str]:
    """A patch file of ``files`` edited on ``base``, with its trees (before, after)."""
    _git(repo, "checkout", "-q", "-b", "patch", "base")
    new = _commit(repo, files, "patch")
    patch = repo.parent / "p.patch"
    patch.write_text(_git(repo, "format-patch", "--stdout", "-1", new) + "\n")
    _git(repo, "checkout", "-q", "--detach", "base")
    return patch, tree_of(repo / ".git", "base"), tree_of(repo / ".git", new)


def _upstream(repo: Path, files: dict[str, str | None]) -> str:
    _git(repo, "checkout", "-q", "-B", "upstream", "base")
    return tree_of(repo / ".git", _commit(repo, files, "upstream"))


def test_clean_merged_empty_and_moved(repo: Path) -> None:
    edited = LINES.replace("line 3\n", "line three\n")
    patch, parent, patched = _patch(repo, {"csrc/kernel.cu": edited})
    # upstream moved the file (and edited it far away): followed by rename detection
    _git(repo, "checkout", "-q", "-B", "upstream", "base")
    (repo / "csrc/stable").mkdir()
    _git(repo, "mv", "csrc/kernel.cu", "csrc/stable/kernel.cu")
    (repo / "csrc/stable/kernel.cu").write_text(LINES.replace("line 19\n", "line nineteen\n"))
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "move")
    moved = tree_of(repo / ".git", "HEAD")
    git_dir = repo / ".git"
    objects = _git(repo, "count-objects", "-v")
    with applier(git_dir, private=True) as work:
        assert work.apply(parent, patch, parent, patched).status == CLEAN
        result = work.apply(moved, patch, parent, patched)
        assert result.status == MERGED
        assert result.detail() == (
            "3-way merge, followed moved file(s): csrc/kernel.cu -> csrc/stable/kernel.cu"
        )
        same = work.apply(patched, patch, parent, patched)
        assert same.status == EMPTY and same.tree == patched
        assert same.detail() == "upstream already has the same edit"
    # private: the merge's objects went to the temporary directory, not the repository
    assert _git(repo, "count-objects", "-v") == objects


def test_conflict_names_the_paths(repo: Path) -> None:
    patch, parent, patched = _patch(repo, {"vllm/a.py": LINES.replace("line 5\n", "ours\n")})
    onto = _upstream(repo, {"vllm/a.py": LINES.replace("line 5\n", "theirs\n")})
    with applier(repo / ".git", private=True) as work:
        result = work.apply(onto, patch, parent, patched)
    assert result.status == CONFLICT and not result.ok
    assert result.conflicts == ("vllm/a.py",)
    assert result.tree == onto
    assert result.detail() == "conflicts in vllm/a.py"
    assert any("CONFLICT (content)" in m for m in result.messages)


def test_exact_series_names_the_failing_patch(repo: Path) -> None:
    patch, parent, _ = _patch(repo, {"vllm/a.py": LINES.replace("line 5\n", "ours\n")})
    onto = _upstream(repo, {"vllm/a.py": None})
    with applier(repo / ".git") as work:
        assert len(work.series(parent, [patch])) == 1
        with pytest.raises(SeriesApplyError) as info:
            work.series(onto, [patch])
        assert info.value.patch == patch
        assert apply_problems(info.value.stderr)[0].path == "vllm/a.py"
        with pytest.raises(ApplyError):
            work.exact(onto, patch.read_bytes())


def test_apply_problems_parses_every_kind() -> None:
    stderr = "\n".join(
        [
            "error: patch failed: vllm/a.py:12",
            "error: vllm/a.py: patch does not apply",
            "error: vllm/gone.py: does not exist in index",
            "error: vllm/new.py: already exists in working directory",
            "Applied patch to 'vllm/b.py' with conflicts.",
            "something else",
        ]
    )
    problems = [(p.path, p.kind, p.line) for p in apply_problems(stderr)]
    assert problems == [
        ("vllm/a.py", "hunk", 12),
        ("vllm/a.py", "fails", 0),
        ("vllm/gone.py", "missing", 0),
        ("vllm/new.py", "exists", 0),
        ("vllm/b.py", "conflict", 0),
    ]
