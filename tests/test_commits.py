"""The one reader of a work tree's series commits (vllm_fork.tree.commits)."""

from __future__ import annotations

from pathlib import Path

import pytest

import vllm_fork.tree.commits as commits_mod
from vllm_fork.errors import WorkTreeError
from vllm_fork.tree.commits import FileChange, read_commits, series_commits
from vllm_fork.tree.materialize import BASE_KEY

from .gitutil import commit, git, trailer_block


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """upstream/9.9.9 plus: a patch with trailers, an empty commit, one without
    trailers that moves and deletes files, a patch with two Fork-Change trailers."""
    tree = tmp_path / "tree"
    tree.mkdir()
    git(tree, "init", "-q", "-b", "fork")
    git(tree, "config", BASE_KEY, "9.9.9")
    git(tree, "config", "user.name", "t")
    git(tree, "config", "user.email", "t@example.invalid")
    commit(tree, "upstream", "import", "", {"pkg/a.py": "a = 1\n", "pkg/b.py": "b = 1\n"})
    git(tree, "tag", "upstream/9.9.9")
    commit(
        tree,
        "Add the gate",
        "Why it is needed.",
        trailer_block(change="ar-rms-pack-gate", part="hardening", Bug="https://x/1"),
        {"pkg/a.py": "a = 2\n", "tests/test_gate.py": "def test_x():\n    pass\n"},
    )
    git(tree, "commit", "-q", "--allow-empty", "-m", "Nothing to change")
    git(tree, "mv", "pkg/b.py", "pkg/c.py")
    git(tree, "rm", "-q", "tests/test_gate.py")
    git(tree, "commit", "-q", "-m", "Move b\n\nNo trailers here.")
    commit(
        tree,
        "Two changes",
        "Body.",
        "Fork-Change: dsv32-decode\nFork-Change: rope-cache-dtype\nFork-Part: change\n",
        {"pkg/d.py": "d = 1\n"},
    )
    return tree


def test_reads_every_field_of_every_commit(tree: Path) -> None:
    found = series_commits(tree)
    assert [c.subject for c in found] == [
        "Add the gate",
        "Nothing to change",
        "Move b",
        "Two changes",
    ]
    shas = git(tree, "rev-list", "--reverse", "upstream/9.9.9..HEAD").split()
    assert [c.sha for c in found] == shas
    assert found[0].parent == git(tree, "rev-parse", "upstream/9.9.9").strip()
    first = found[0]
    assert (first.change, first.part, first.get("bug")) == (
        "ar-rms-pack-gate",
        "hardening",
        "https://x/1",
    )
    assert first.origin.startswith("backport, ")
    assert first.message.startswith("Add the gate\n\nWhy it is needed.\n")
    assert first.files == (FileChange("M", "pkg/a.py"), FileChange("A", "tests/test_gate.py"))
    assert first.paths("A") == ["tests/test_gate.py"]


def test_edge_cases_are_decided(tree: Path) -> None:
    _, empty, no_trailers, two = series_commits(tree)
    assert empty.files == () and empty.trailers == ()
    assert (no_trailers.change, no_trailers.part, no_trailers.trailers) == ("", "", ())
    # no rename detection: a move is a delete plus an add
    assert set(no_trailers.files) == {
        FileChange("D", "pkg/b.py"),
        FileChange("A", "pkg/c.py"),
        FileChange("D", "tests/test_gate.py"),
    }
    assert two.values("fork-change") == ["dsv32-decode", "rope-cache-dtype"]
    assert two.change == "dsv32-decode"


def test_detached_head_is_read_like_a_branch(tree: Path) -> None:
    git(tree, "checkout", "-q", "--detach", "HEAD~1")
    assert [c.subject for c in series_commits(tree)] == [
        "Add the gate",
        "Nothing to change",
        "Move b",
    ]


def test_merge_commit_is_refused(tree: Path) -> None:
    git(tree, "checkout", "-q", "-b", "side", "HEAD~1")
    commit(tree, "Side", "Body.", "", {"pkg/side.py": "s = 1\n"})
    git(tree, "checkout", "-q", "fork")
    git(tree, "merge", "-q", "--no-edit", "side")
    with pytest.raises(WorkTreeError, match="merge commits after upstream/9.9.9"):
        series_commits(tree)


def test_missing_tag_and_foreign_head_are_refused(tree: Path) -> None:
    with pytest.raises(WorkTreeError, match="has no tag upstream/1.0.0"):
        series_commits(tree, "upstream/1.0.0")
    git(tree, "checkout", "-q", "--orphan", "other")
    commit(tree, "Unrelated", "Body.", "", {"x.py": "x = 1\n"})
    with pytest.raises(WorkTreeError, match="does not descend from upstream/9.9.9"):
        series_commits(tree)


def test_not_a_work_tree_is_refused(tmp_path: Path) -> None:
    with pytest.raises(WorkTreeError, match="not a git work tree"):
        series_commits(tmp_path)


def test_git_calls_do_not_grow_with_the_series(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[list[str]] = []
    real = commits_mod.run_git

    def counting(args: list[str], *rest: object, **kw: object) -> object:
        calls.append([str(a) for a in args])
        return real(args, *rest, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(commits_mod, "run_git", counting)
    assert len(series_commits(tree)) == 4
    # the recorded base, the ancestry check and one log for all four commits
    assert len(calls) == 3
    assert sum(call[0] == "log" for call in calls) == 1


def test_read_commits_keeps_the_given_order(tree: Path) -> None:
    shas = git(tree, "rev-list", "upstream/9.9.9..HEAD").split()  # newest first
    assert [c.sha for c in read_commits(tree, shas)] == shas
    assert read_commits(tree, []) == []
