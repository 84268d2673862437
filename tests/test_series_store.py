"""The stored-once series (series/store.py): dedup, byte-stable round trips,
conversion of the legacy layout, and atomic writes under faults."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_fork.cli.main import main
from vllm_fork.errors import SeriesError
from vllm_fork.series import store
from vllm_fork.series.patches import load_series
from vllm_fork.tree.export import export
from vllm_fork.tree.materialize import materialize

from .conftest import FAKE_VERSION, ForkRepo
from .gitutil import commit, git, trailer_block

ROOT = Path(__file__).resolve().parents[1]


def patch_bytes(subject: str, body: str = "x", index: str = "1111111", at: int = 1) -> bytes:
    """A small format-patch file; ``index`` and ``at`` vary as between two bases."""
    return (
        "From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n"
        "From: vLLM ROCm fork maintainers <rocm-fork-maintainers@users.noreply.github.com>\n"
        "Date: Sat, 21 Nov 2026 12:00:00 +0000\n"
        f"Subject: {subject}\n\n"
        f"{body}\n\nFork-Patch: {subject.lower().replace(' ', '-')}\n---\n"
        " a.py | 1 +\n 1 file changed, 1 insertion(+)\n\n"
        "diff --git a/a.py b/a.py\n"
        f"index {index}..2222222 100644\n--- a/a.py\n+++ b/a.py\n"
        f"@@ -{at},3 +{at},4 @@\n"
        + "".join(f" context line {i}\n" for i in range(40))
        + "+added\n--\n2.43.0\n\n"
    ).encode()


def base(*patches: tuple[str, bytes], comments: tuple[str, ...] = ()) -> store.BaseSeries:
    return store.BaseSeries(
        [store.stem_of(n) for n, _ in patches], [d for _, d in patches], list(comments)
    )


def tree_files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def sample() -> dict[str, store.BaseSeries]:
    one, two = patch_bytes("Fix one"), patch_bytes("Fix two")
    moved = patch_bytes("Fix one", index="3333333", at=7)  # the same change, other offsets
    return {
        "1.0.0": base(("0001-Fix-one.patch", moved), ("0002-Fix-two.patch", two)),
        "1.1.0": base(("0001-Fix-one.patch", one), ("0002-Fix-two.patch", two)),
        "1.1.1": base(("0001-Fix-one.patch", one), ("0002-Fix-two.patch", two)),
        "1.2.0": base(("0001-Fix-one.patch", one), comments=("# Applied-Upstream: 1.2.0 <- x",)),
    }


def test_each_content_is_stored_once_and_reads_back_byte_identical(tmp_path: Path) -> None:
    root = tmp_path / "series"
    bases = sample()
    change = store.write_store(root, bases)
    assert change.changed
    files = tree_files(root)
    assert len(set(files.values())) == len(files)  # no two files with the same content
    pool = sorted(files)
    # three distinct patch contents: two full, the moved one as a delta of the newest's
    assert [p for p in pool if p.startswith("pool/")] == sorted(
        f"pool/{store.variant_ref(s, d)}{ext}"
        for s, d, ext in [
            ("Fix-one", bases["1.0.0"].contents[0], store.DELTA),
            ("Fix-one", bases["1.1.0"].contents[0], store.FULL),
            ("Fix-two", bases["1.1.0"].contents[1], store.FULL),
        ]
    )
    index = (root / store.INDEX_FILE).read_text()
    assert "[1.1.0 1.1.1]\n" in index  # identical series share one section
    again = store.read_all(root)
    assert {v: b.key() for v, b in again.items()} == {v: b.key() for v, b in bases.items()}
    assert again["1.2.0"].names == ["0001-Fix-one.patch"]
    # writing the same content again writes nothing
    before = {p: os.stat(root / p).st_mtime_ns for p in files}
    assert not store.write_store(root, again).changed
    assert {p: os.stat(root / p).st_mtime_ns for p in tree_files(root)} == before


def test_variants_no_base_references_are_removed(tmp_path: Path) -> None:
    root = tmp_path / "series"
    bases = sample()
    store.write_store(root, bases)
    change = store.update_base(root, "1.0.0", None)
    assert any(p.endswith(store.DELTA) for p in change.removed)
    assert list(store.read_all(root)) == ["1.1.0", "1.1.1", "1.2.0"]
    assert not list((root / store.POOL_DIR).glob(f"*{store.DELTA}"))


def test_a_corrupt_pool_variant_is_a_clear_error(tmp_path: Path) -> None:
    root = tmp_path / "series"
    store.write_store(root, sample())
    full = sorted((root / store.POOL_DIR).glob(f"Fix-one*{store.FULL}"))[0]
    full.write_bytes(full.read_bytes().replace(b"added", b"changed"))
    with pytest.raises(SeriesError, match="does not match its name"):
        store.read_all(root)


def test_the_legacy_layout_is_read_and_converted(tmp_path: Path) -> None:
    root = tmp_path / "series"
    legacy = root / "1.0.0"
    legacy.mkdir(parents=True)
    data = patch_bytes("Fix one")
    (legacy / "0001-Fix-one.patch").write_bytes(data)
    (legacy / "revision").write_text("3\n")
    (legacy / "series").write_text(
        store.LEGACY_HEADER + "0001-Fix-one.patch\n# Applied-Upstream: 1.0.0 <- old\n"
    )
    before = store.read_all(root)
    assert before["1.0.0"].comments == ["# Applied-Upstream: 1.0.0 <- old"]
    assert load_series(legacy, validate=False).patches[0].read_bytes() == data
    store.write_store(root, before)
    assert sorted(p.name for p in legacy.iterdir()) == ["revision"]  # kept: not series data
    assert store.read_all(root)["1.0.0"].key() == before["1.0.0"].key()
    assert store.versions(root) == ["1.0.0"]


def test_the_committed_series_round_trips_byte_for_byte(tmp_path: Path) -> None:
    committed = store.read_all(ROOT / "series")
    assert len(committed) == 20
    root = tmp_path / "series"
    store.write_store(root, committed)
    assert tree_files(root) == {
        k: v for k, v in tree_files(ROOT / "series").items() if k == "index" or "/" in k
    }
    files = tree_files(ROOT / "series")
    assert len(set(files.values())) == len(files), "two files under series/ are the same"


@pytest.mark.parametrize("fault", ["series.index:kill", "series.write:enospc"])
def test_a_killed_or_failing_write_leaves_the_old_store(tmp_path: Path, fault: str) -> None:
    root = tmp_path / "series"
    store.write_store(root, sample())
    before = tree_files(root)
    script = (
        "import sys; from pathlib import Path; from vllm_fork.series import store\n"
        "root = Path(sys.argv[1]); bases = store.read_all(root)\n"
        "bases['1.0.0'] = bases['1.2.0']; bases['1.3.0'] = bases['1.1.0']\n"
        "store.write_store(root, bases)\n"
    )
    env = {**os.environ, "VLLM_FORK_FAULT": fault}
    proc = subprocess.run([sys.executable, "-c", script, str(root)], env=env, check=False)
    assert proc.returncode != 0
    after = store.read_all(root)
    assert {v: b.key() for v, b in after.items()} == {v: b.key() for v, b in sample().items()}
    assert (root / "index").read_bytes() == before["index"]
    # the next write tidies what the killed run left
    store.write_store(root, after)
    assert tree_files(root) == before


def _export_round_trip(fork_repo: ForkRepo, tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    materialize(fork_repo.config, FAKE_VERSION, tree)
    commit(tree, "Add f3", "Adds f3.", trailer_block(), {"f3.py": "x = 3\n"})
    commit(tree, "Add f4", "Adds f4.", trailer_block(), {"f4.py": "x = 4\n"})
    assert export(fork_repo.config, tree).changed


def test_export_writes_the_store_byte_stable(
    fork_repo: ForkRepo, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _export_round_trip(fork_repo, tmp_path)
    series_root = fork_repo.config.series_root
    legacy = tree_files(series_root)
    assert main(["series-store"]) == 0
    assert "files 3 -> 3" in capsys.readouterr().out  # 2 patches + series -> 2 + index
    assert not (series_root / FAKE_VERSION).exists()
    assert main(["series-store", "--check"]) == 0
    stored = tree_files(series_root)
    # materialize of the stored base gives the same commits; export writes nothing
    again = tmp_path / "again"
    materialize(fork_repo.config, FAKE_VERSION, again)
    result = export(fork_repo.config, again)
    assert not result.changed and tree_files(series_root) == stored
    assert [p.read_bytes() for p in load_series(fork_repo.series_dir()).patches] == [
        legacy[f"{FAKE_VERSION}/{n}"] for n in result.patches
    ]
    # an edit adds one variant and drops the one no base references any more
    commit(again, "Add f5", "Adds f5.", trailer_block(), {"f5.py": "x = 5\n"})
    result = export(fork_repo.config, again)
    assert result.written == ["0003-Add-f5.patch"]
    added = load_series(fork_repo.series_dir()).patches[2].read_bytes()
    assert [p for p in result.store.written if p.startswith("pool/")] == [
        f"pool/{store.variant_ref('Add-f5', added)}.patch"
    ]
    # an amended commit replaces its variant: the old one, now unreferenced, goes
    (again / "f5.py").write_text("x = 55\n")
    git(again, "commit", "-q", "-a", "--amend", "--no-edit")
    result = export(fork_repo.config, again)
    assert result.store.removed == [f"pool/{store.variant_ref('Add-f5', added)}.patch"]
    files = tree_files(series_root)
    assert len(set(files.values())) == len(files) == 4  # index + three variants
    shutil.rmtree(again)
    materialize(fork_repo.config, FAKE_VERSION, again)
    assert not export(fork_repo.config, again).changed


def test_a_per_base_series_merged_in_later_overrides_the_index(tmp_path: Path) -> None:
    root = tmp_path / "series"
    store.write_store(root, sample())
    # a branch that still edits the per-base layout, merged after the conversion
    newer = patch_bytes("Fix one", body="folded")
    legacy = root / "1.1.1"
    legacy.mkdir()
    (legacy / "0001-Fix-one.patch").write_bytes(newer)
    (legacy / "series").write_text("0001-Fix-one.patch\n")
    # and git applied its edit to a shared pool variant (a rename it detected)
    (full,) = [p for p in (root / store.POOL_DIR).glob("Fix-two*") if p.suffix == store.FULL]
    good = full.read_bytes()
    full.write_bytes(good + b"edited\n")
    with pytest.raises(SeriesError, match="vllm-fork series-store"):
        store.read_base(root, "1.1.0")
    assert store.read_base(root, "1.1.1").contents == [newer]  # its variants are not read
    full.write_bytes(good)
    bases = store.read_all(root)
    assert bases["1.1.1"].contents == [newer]
    bases.update({v: b for v, b in sample().items() if v != "1.1.1"})
    store.write_store(root, bases)
    assert not legacy.exists()
    assert store.read_all(root)["1.1.1"].contents == [newer]
    assert store.read_all(root)["1.1.0"].key() == sample()["1.1.0"].key()


def test_a_file_written_by_a_reader_does_not_reach_the_next_reader() -> None:
    """The expanded copies of a series are shared by every reader of the same
    series in a process: one that writes to its patch file must not change what
    the next reader gets."""
    data = b"From 0 Mon Sep 17 00:00:00 2001\nSubject: [Kernel] A\n\nbody\n---\n"
    base = store.BaseSeries(["Kernel-A"], [data], [], ["0001-Kernel-A.patch"])
    _, (path,) = store.expand(base)
    assert path.read_bytes() == data
    path.write_bytes(data.replace(b"body", b"edited by a reader"))
    _, (again,) = store.expand(base)
    assert again == path and again.read_bytes() == data
