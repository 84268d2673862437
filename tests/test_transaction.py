"""The one resume-and-commit helper (src/vllm_fork/transaction.py) and the one
home of write-then-rename (src/vllm_fork/atomic.py)."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from vllm_fork.atomic import copy_atomic, place_dir, write_bytes_atomic
from vllm_fork.transaction import StateFile, StateUnreadable, TreeCommit, plan_writes

SRC = Path(__file__).resolve().parents[1] / "src" / "vllm_fork"


def test_state_file_round_trip_and_stamp(tmp_path: Path) -> None:
    state = StateFile(tmp_path / "s.json", 3, tool="1.0")
    assert state.load() is None
    state.save({"results": {"a": 1}})
    saved = json.loads((tmp_path / "s.json").read_text())
    assert saved == {"results": {"a": 1}, "schema": 3, "tool": "1.0"}
    assert state.load() == saved


def test_state_of_another_format_starts_afresh_unless_strict(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    StateFile(path, 1, tool="0.9").save({"x": 1})
    assert StateFile(path, 1, tool="1.0").load() is None  # another tool version
    assert StateFile(path, 2, tool="0.9").load() is None  # another schema
    with pytest.raises(StateUnreadable, match="another version"):
        StateFile(path, 2, strict=True).load()
    path.write_text("{not json")
    assert StateFile(path, 1).load() is None
    with pytest.raises(StateUnreadable, match="unreadable"):
        StateFile(path, 1, strict=True).load()
    assert path.read_text() == "{not json"  # never removed by reading it


def test_plan_writes_orders_new_files_then_last_then_removals(tmp_path: Path) -> None:
    root, staged = tmp_path / "root", tmp_path / "staged"
    for d, files in (
        (root, {"index": "old", "a": "same", "gone": "x"}),
        (staged, {"index": "new", "a": "same", "b/new": "n"}),
    ):
        for name, text in files.items():
            (d / name).parent.mkdir(parents=True, exist_ok=True)
            (d / name).write_text(text)
    write, remove = plan_writes(root, staged, last=["index"])
    assert write == ["b/new", "index"]
    assert remove == ["gone"]


def _tree(tmp_path: Path) -> tuple[Path, Path]:
    root, staged = tmp_path / "root", tmp_path / "staged"
    root.mkdir()
    staged.mkdir()
    (root / "old").write_text("old")
    (staged / "one").write_text("1")
    (staged / "two").write_text("2")
    return root, staged


def test_a_commit_killed_while_writing_is_finished_by_the_next_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root, staged = _tree(tmp_path)
    state_file = StateFile(tmp_path / "state.json", 1)
    state: dict = {}
    commit = TreeCommit(state, lambda: state_file.save(state), fault="test.commit")
    monkeypatch.setenv("VLLM_FORK_FAULT", "test.commit:error")
    with pytest.raises(OSError):
        commit.run(root, staged, ["one", "two"], ["old"])
    monkeypatch.delenv("VLLM_FORK_FAULT")
    assert (root / "one").read_text() == "1" and not (root / "two").exists()
    # the next run reads the journal from disk and finishes the recorded list
    again = state_file.load()
    assert again is not None
    resumed = TreeCommit(again, lambda: state_file.save(again))
    assert resumed.interrupted
    assert resumed.resume(root, staged) == ["one", "two", "old"]
    assert sorted(p.name for p in root.iterdir()) == ["one", "two"]
    assert resumed.done and not resumed.interrupted


def test_an_unjournaled_commit_writes_in_order(tmp_path: Path) -> None:
    root, staged = _tree(tmp_path)
    assert TreeCommit().run(root, staged, ["one", "two"], ["old"]) == ["one", "two", "old"]
    assert sorted(p.name for p in root.iterdir()) == ["one", "two"]


def test_atomic_writes_leave_the_old_file_on_a_fault(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "f"
    target.write_bytes(b"old")
    monkeypatch.setenv("VLLM_FORK_FAULT", "test.write:enospc")
    with pytest.raises(OSError):
        write_bytes_atomic(target, b"new", fault="test.write")
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"]  # no temp file left
    monkeypatch.delenv("VLLM_FORK_FAULT")
    source = tmp_path / "src"
    source.write_bytes(b"copied")
    copy_atomic(source, tmp_path / "d" / "copy", shared=True)
    assert (tmp_path / "d" / "copy").read_bytes() == b"copied"
    staging = tmp_path / "staging"
    (staging / "x").mkdir(parents=True)
    place_dir(staging, tmp_path / "placed")
    assert (tmp_path / "placed" / "x").is_dir() and not staging.exists()


def _renames_outside_atomic() -> list[str]:
    """Calls of os.replace / os.rename / Path.replace / Path.rename in the package
    outside atomic.py (moving a directory aside to delete it is named in ASIDE)."""
    aside = {("sources/upstream.py", "_discard_repo")}
    found = []
    for path in sorted(SRC.rglob("*.py")):
        rel = str(path.relative_to(SRC))
        if rel == "atomic.py":
            continue
        tree = ast.parse(path.read_text())
        for func in ast.walk(tree):
            if not isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(func):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and node.func.attr in {"replace", "rename"}
                    and not (isinstance(node.func.value, ast.Constant))
                    and (rel, func.name) not in aside
                    and (
                        (isinstance(node.func.value, ast.Name) and node.func.value.id == "os")
                        or len(node.args) == 1
                        and not node.keywords
                    )
                ):
                    found.append(f"{rel}:{node.lineno} {func.name}")
    return found


def test_every_write_then_rename_goes_through_atomic() -> None:
    assert _renames_outside_atomic() == []
