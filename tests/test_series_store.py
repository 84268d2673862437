"""The series store (series/store.py): plain patches stored once, byte-stable
round trips, atomic writes under faults; and the conversion of the older
layouts (series/legacy.py), merges of branches that still write them included."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from difflib import SequenceMatcher
from pathlib import Path

import pytest

from vllm_fork.cli.main import main
from vllm_fork.errors import SeriesError
from vllm_fork.series import legacy, store
from vllm_fork.series.patches import load_series
from vllm_fork.tree.export import export
from vllm_fork.tree.materialize import materialize

from .conftest import FAKE_VERSION, ForkRepo
from .gitutil import IDENTITY, commit, git, trailer_block

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, **IDENTITY}


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


def keys(bases: dict[str, store.BaseSeries]) -> dict[str, object]:
    return {v: b.key() for v, b in bases.items()}


def sample() -> dict[str, store.BaseSeries]:
    one, two = patch_bytes("Fix one"), patch_bytes("Fix two")
    moved = patch_bytes("Fix one", index="3333333", at=7)  # the same change, other offsets
    return {
        "1.0.0": base(("0001-Fix-one.patch", moved), ("0002-Fix-two.patch", two)),
        "1.1.0": base(("0001-Fix-one.patch", one), ("0002-Fix-two.patch", two)),
        "1.1.1": base(("0001-Fix-one.patch", one), ("0002-Fix-two.patch", two)),
        "1.2.0": base(("0001-Fix-one.patch", one), comments=("# Applied-Upstream: 1.2.0 <- x",)),
    }


def test_each_content_is_stored_once_as_a_plain_patch(tmp_path: Path) -> None:
    root = tmp_path / "series"
    bases = sample()
    change = store.write_store(root, bases)
    assert change.changed
    files = tree_files(root)
    pool = {k: v for k, v in files.items() if k.startswith("pool/")}
    # three distinct patch contents, each a plain file: what git format-patch wrote
    assert sorted(pool) == sorted(
        f"pool/{store.pool_name(s, d)}"
        for s, d in [
            ("Fix-one", bases["1.0.0"].contents[0]),
            ("Fix-one", bases["1.1.0"].contents[0]),
            ("Fix-two", bases["1.1.0"].contents[1]),
        ]
    )
    assert set(pool.values()) == {d for b in bases.values() for d in b.contents}
    # one series file per base, listing pool files in order after its '#' lines
    assert sorted(k for k in files if not k.startswith("pool/")) == [f"{v}/series" for v in bases]
    text = files["1.2.0/series"].decode()
    assert text == (
        store.HEADER
        + "# Applied-Upstream: 1.2.0 <- x\n"
        + f"{store.pool_name('Fix-one', bases['1.2.0'].contents[0])}\n"
    )
    assert files["1.1.0/series"] == files["1.1.1/series"]
    again = store.read_all(root)
    assert keys(again) == keys(bases)
    assert again["1.2.0"].names == ["0001-Fix-one.patch"]
    assert [store.digest(b) for b in again.values()] == [store.digest(b) for b in bases.values()]
    # writing the same content again writes nothing
    before = {p: os.stat(root / p).st_mtime_ns for p in files}
    assert not store.write_store(root, again).changed
    assert {p: os.stat(root / p).st_mtime_ns for p in tree_files(root)} == before


def test_a_pool_patch_applies_with_git_am(tmp_path: Path) -> None:
    """The pool holds what `git am` takes: a base's series applied by hand."""
    work = tmp_path / "work"
    work.mkdir()
    git(work, "init", "-q")
    (work / "a.py").write_text("".join(f"line {i}\n" for i in range(10)))
    git(work, "add", "a.py")
    git(work, "commit", "-qm", "upstream")
    (work / "a.py").write_text("".join(f"line {i}\n" for i in range(10)) + "added\n")
    git(work, "commit", "-qam", "Fix one")
    out = git(work, "format-patch", "--keep-subject", "--zero-commit", "-1", "-o", "out")
    data = (work / out.strip()).read_bytes()
    root = tmp_path / "series"
    store.write_store(root, {"1.0.0": base(("0001-Fix-one.patch", data))})
    git(work, "reset", "-q", "--hard", "HEAD^")
    names, _ = store.parse_series((root / "1.0.0" / "series").read_text(), "series")
    git(work, "am", "-q", *[str(root / "pool" / n) for n in names])
    assert (work / "a.py").read_text().endswith("line 9\nadded\n")
    assert git(work, "log", "-1", "--format=%s").strip() == "Fix one"


def test_pool_files_no_series_names_are_removed(tmp_path: Path) -> None:
    root = tmp_path / "series"
    bases = sample()
    store.write_store(root, bases)
    moved = store.pool_name("Fix-one", bases["1.0.0"].contents[0])
    change = store.update_base(root, "1.0.0", None)
    assert change.removed == ["1.0.0/series", f"pool/{moved}"]
    assert list(store.read_all(root)) == ["1.1.0", "1.1.1", "1.2.0"]
    assert not (root / "1.0.0").exists()


def test_a_base_directory_keeps_its_other_files(tmp_path: Path) -> None:
    root = tmp_path / "series"
    store.write_store(root, sample())
    (root / "1.0.0" / "revision").write_text("3\n")
    store.update_base(root, "1.0.0", None)
    assert sorted(p.name for p in (root / "1.0.0").iterdir()) == ["revision"]
    assert not store.has_series(root, "1.0.0")


def test_a_changed_or_missing_pool_file_is_a_clear_error(tmp_path: Path) -> None:
    root = tmp_path / "series"
    store.write_store(root, sample())
    (full,) = sorted((root / store.POOL_DIR).glob("Fix-two*"))
    good = full.read_bytes()
    full.write_bytes(good.replace(b"added", b"changed"))
    with pytest.raises(SeriesError, match="does not match its name"):
        store.read_all(root)
    full.unlink()
    with pytest.raises(SeriesError, match=r"series/1\.0\.0/series names Fix-two.*git checkout"):
        store.read_base(root, "1.0.0")


def test_a_series_file_names_only_pool_files(tmp_path: Path) -> None:
    root = tmp_path / "series"
    store.write_store(root, sample())
    series = root / "1.2.0" / "series"
    good = series.read_text()
    series.write_text(good + good.splitlines()[-1] + "\n")
    with pytest.raises(SeriesError, match="listed twice"):
        store.read_base(root, "1.2.0")
    series.write_text(good + "../x.patch\n")
    with pytest.raises(SeriesError, match="not a file name of series/pool/"):
        store.read_base(root, "1.2.0")
    series.write_text(good + "<<<<<<< ours\n")
    with pytest.raises(SeriesError, match="a merge conflict"):
        store.read_base(root, "1.2.0")


@pytest.mark.parametrize(
    "older", ["index", "pool/Fix-one.0123456789.delta", "1.0.0/0001-Fix-one.patch"]
)
def test_every_reader_refuses_a_store_with_files_of_an_older_layout(
    tmp_path: Path, older: str
) -> None:
    """Merged in from a branch that still writes an older layout: reading past
    them would drop that branch's work without a word."""
    root = tmp_path / "series"
    store.write_store(root, sample())
    (root / older).write_text("x\n")
    for read in (
        lambda: store.read_all(root),
        lambda: store.read_base(root, "1.1.0"),
        lambda: store.versions(root),
        lambda: store.has_series(root, "1.1.0"),
        lambda: store.update_base(root, "1.1.0", None),
    ):
        with pytest.raises(SeriesError, match=r"older series layout.*vllm-fork series-store"):
            read()


# --- the older layouts, written as the tool of their time wrote them ---------------------


def make_delta(parent_ref: str, parent: bytes, data: bytes) -> bytes:
    """A line delta of the delta store (the format series/legacy.py reads)."""
    old, new = legacy._lines(parent), legacy._lines(data)
    out = [legacy.DELTA_MAGIC, f"base {parent_ref}\nsha256 {store.content_hash(data)}\n".encode()]
    for op, i1, i2, j1, j2 in SequenceMatcher(None, old, new, autojunk=False).get_opcodes():
        if op == "equal":
            out.append(f"= {i1} {i2 - i1}\n".encode())
        elif j2 > j1:
            out.append(f"+ {j2 - j1}\n".encode())
            out.extend(new[j1:j2])
    return b"".join(out)


def ref(stem: str, data: bytes) -> str:
    return store.pool_name(stem, data)[: -len(store.PATCH)]


def write_delta_store(root: Path, bases: dict[str, store.BaseSeries]) -> None:
    """``bases`` in the line-delta layout: an index, the newest base's variant of
    each patch in full, the others as deltas against it."""
    pool = root / store.POOL_DIR
    pool.mkdir(parents=True, exist_ok=True)
    newest: dict[str, tuple[str, bytes]] = {}
    for version in store.sort_versions(bases):
        for stem, data in zip(bases[version].stems, bases[version].contents, strict=True):
            newest[stem] = (ref(stem, data), data)
    lines = ["# Stored-once series (docs/series-format.md), written by `vllm-fork export`.\n"]
    groups: dict[object, list[str]] = {}
    for version in store.sort_versions(bases):
        groups.setdefault(bases[version].key(), []).append(version)
    for versions in groups.values():
        b = bases[versions[0]]
        lines.append(f"[{' '.join(versions)}]\n")
        lines += [f"{c}\n" for c in b.comments]
        for stem, data in zip(b.stems, b.contents, strict=True):
            lines.append(f"{ref(stem, data)}\n")
            parent_ref, parent = newest[stem]
            if parent_ref == ref(stem, data):
                (pool / f"{parent_ref}.patch").write_bytes(data)
            else:
                (pool / f"{parent_ref}.patch").write_bytes(parent)
                delta = make_delta(parent_ref, parent, data)
                (pool / f"{ref(stem, data)}.delta").write_bytes(delta)
    (root / legacy.INDEX_FILE).write_text("".join(lines))


def test_the_delta_store_converts_to_plain_patches(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "series"
    bases = sample()
    write_delta_store(root, bases)
    assert any(p.suffix == ".delta" for p in (root / "pool").iterdir())
    (root / "1.0.0").mkdir()
    (root / "1.0.0" / "revision").write_text("3\n")
    with pytest.raises(SeriesError, match="series-store"):
        store.read_all(root)
    digests = {v: store.digest(b) for v, b in bases.items()}
    check = legacy.convert(root, check=True)
    assert check.change.changed and "index" in check.change.removed
    assert tree_files(root)["index"]  # --check writes nothing
    result = legacy.convert(root)
    assert "index" in result.change.removed and not (root / "index").exists()
    assert not [p for p in (root / "pool").iterdir() if p.suffix != ".patch"]
    after = store.read_all(root)
    assert keys(after) == keys(bases)
    assert {v: store.digest(b) for v, b in after.items()} == digests  # release-check resumes
    assert (root / "1.0.0" / "revision").read_text() == "3\n"
    files = tree_files(root)
    # the same as the writer makes from the bases themselves
    fresh = tmp_path / "fresh"
    store.write_store(fresh, bases)
    assert tree_files(fresh) == {k: v for k, v in files.items() if k != "1.0.0/revision"}
    # idempotent: the second run and the check find nothing to do
    assert not legacy.convert(root).change.changed
    monkeypatch.setenv("VLLM_FORK_ROOT", str(tmp_path))
    monkeypatch.setenv("VLLM_FORK_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "bases.toml").write_text("")
    assert main(["series-store", "--check"]) == 0
    assert "as written" in capsys.readouterr().out
    (root / "pool" / "stray.0123456789.patch").write_bytes(b"x")
    assert main(["series-store", "--check"]) == 1
    assert "would remove pool/stray.0123456789.patch" in capsys.readouterr().out
    assert main(["series-store"]) == 0
    assert "files 9 -> 8" in capsys.readouterr().out
    assert tree_files(root) == files


def test_the_per_base_layout_converts(tmp_path: Path) -> None:
    root = tmp_path / "series"
    directory = root / "1.0.0"
    directory.mkdir(parents=True)
    data = patch_bytes("Fix one")
    (directory / "0001-Fix-one.patch").write_bytes(data)
    (directory / "revision").write_text("3\n")
    (directory / "series").write_text(
        legacy.LEGACY_HEADER + "0001-Fix-one.patch\n# Applied-Upstream: 1.0.0 <- old\n"
    )
    with pytest.raises(SeriesError, match="series-store"):
        store.read_base(root, "1.0.0")
    legacy.convert(root)
    assert sorted(p.name for p in directory.iterdir()) == ["revision", "series"]
    got = store.read_base(root, "1.0.0")
    assert got is not None and got.contents == [data]
    assert got.comments == ["# Applied-Upstream: 1.0.0 <- old"]
    assert load_series(directory, validate=False).patches[0].read_bytes() == data


def test_a_per_base_series_with_errors_is_refused(tmp_path: Path) -> None:
    d = tmp_path / "series" / "1.0"
    d.mkdir(parents=True)
    data = patch_bytes("Fix one")
    (d / "series").write_text("# comment\n0002-b.patch  # trailing\n\n0001-a.patch\n")
    with pytest.raises(SeriesError, match="lists 0002-b.patch, which does not exist"):
        legacy.read_per_base(d)
    for name in ("0001-a.patch", "0002-b.patch", "0003-stray.patch"):
        (d / name).write_bytes(data)
    with pytest.raises(SeriesError, match="not listed: 0003-stray.patch"):
        legacy.read_per_base(d)
    (d / "0003-stray.patch").unlink()
    got = legacy.read_per_base(d)
    assert got.stems == ["b", "a"] and got.comments == ["# comment"]
    (d / "series").write_text("0001-a.patch\n0001-a.patch\n")
    with pytest.raises(SeriesError, match="listed twice"):
        legacy.read_per_base(d)
    (d / "series").write_text("../x.patch\n")
    with pytest.raises(SeriesError, match="not a plain file name"):
        legacy.read_per_base(d)


def test_a_file_of_no_layout_is_refused_not_removed(tmp_path: Path) -> None:
    root = tmp_path / "series"
    store.write_store(root, sample())
    (root / "README").write_text("notes\n")
    with pytest.raises(SeriesError, match="README belong"):
        legacy.convert(root)
    assert (root / "README").is_file()


def test_the_committed_series_is_plain_and_as_written(tmp_path: Path) -> None:
    series = ROOT / "series"
    assert store.old_layout(series) == []
    committed = store.read_all(series)
    assert len(committed) == 20
    assert not legacy.convert(series, check=True).change.changed
    root = tmp_path / "series"
    store.write_store(root, committed)
    assert tree_files(root) == {k: v for k, v in tree_files(series).items() if "revision" not in k}
    pool = tree_files(series / store.POOL_DIR)
    assert len(set(pool.values())) == len(pool), "two pool files hold the same patch"
    assert all(d.startswith(b"From ") and b"\ndiff --git " in d for d in pool.values())


@pytest.mark.parametrize("fault", ["series.lists:kill", "series.write:enospc"])
def test_a_killed_or_failing_write_leaves_a_readable_store(tmp_path: Path, fault: str) -> None:
    root = tmp_path / "series"
    store.write_store(root, sample())
    before = tree_files(root)
    script = (
        "import sys; from pathlib import Path; from vllm_fork.series import store\n"
        "root = Path(sys.argv[1]); bases = store.read_all(root)\n"
        "bases['1.0.0'] = bases['1.2.0']; bases['1.3.0'] = bases['1.1.0']\n"
        "bases['1.1.0'].contents[0] = bases['1.1.0'].contents[0] + b'x\\n'\n"
        "store.write_store(root, bases)\n"
    )
    env = {**os.environ, "VLLM_FORK_FAULT": fault}
    proc = subprocess.run([sys.executable, "-c", script, str(root)], env=env, check=False)
    assert proc.returncode != 0
    after = store.read_all(root)
    assert keys(after) == keys(sample())
    assert {k: v for k, v in tree_files(root).items() if not k.startswith("pool/")} == {
        k: v for k, v in before.items() if not k.startswith("pool/")
    }
    # the next write tidies what the killed run left
    store.write_store(root, after)
    assert tree_files(root) == before


@pytest.mark.parametrize("fault", ["series.write", "series.lists", "series.tidy"])
def test_a_killed_conversion_converts_on_the_next_run(tmp_path: Path, fault: str) -> None:
    root = tmp_path / "series"
    write_delta_store(root, sample())
    per_base = root / "2.0.0"
    per_base.mkdir()
    data = patch_bytes("Fix three")
    (per_base / "0001-Fix-three.patch").write_bytes(data)
    (per_base / "series").write_text(legacy.LEGACY_HEADER + "0001-Fix-three.patch\n")
    script = (
        "import sys; from pathlib import Path; from vllm_fork.series import legacy\n"
        "legacy.convert(Path(sys.argv[1]))\n"
    )
    env = {**os.environ, "VLLM_FORK_FAULT": f"{fault}:kill"}
    proc = subprocess.run([sys.executable, "-c", script, str(root)], env=env, check=False)
    assert proc.returncode == -9
    assert (root / "index").is_file()  # the older layout is whole until the end
    with pytest.raises(SeriesError, match="series-store"):
        store.read_all(root)
    legacy.convert(root)
    want = {**sample(), "2.0.0": base(("0001-Fix-three.patch", data))}
    assert keys(store.read_all(root)) == keys(want)
    fresh = tmp_path / "fresh"
    store.write_store(fresh, want)
    assert tree_files(root) == tree_files(fresh)


# --- merging a branch that still writes the line-delta store --------------------------


def _repo_with_delta_store(tmp_path: Path) -> tuple[Path, Path]:
    repo = tmp_path / "repo"
    root = repo / "series"
    root.mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    write_delta_store(root, sample())
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "the delta store")
    return repo, root


def _edit(bases: dict[str, store.BaseSeries], version: str, at: int, text: bytes) -> None:
    b = bases[version]
    b.contents[at] = b.contents[at].replace(b"+added\n", b"+added\n+" + text + b"\n")


def test_a_branch_in_flight_merges_base_by_base(tmp_path: Path) -> None:
    """main converted the store and changed 1.2.0 since; the branch, still on the
    delta store, changed 1.0.0 and 1.1.0: after the merge, `series-store` keeps
    both sides' changes, each where it was made."""
    repo, root = _repo_with_delta_store(tmp_path)
    git(repo, "checkout", "-q", "-b", "branch")
    theirs = sample()
    _edit(theirs, "1.0.0", 1, b"branch")
    _edit(theirs, "1.1.0", 0, b"branch")
    shutil.rmtree(root)
    write_delta_store(root, theirs)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "the branch")
    git(repo, "checkout", "-q", "main")
    legacy.convert(root)
    ours = store.read_all(root)
    _edit(ours, "1.2.0", 0, b"main")
    store.write_store(root, ours)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "converted, then 1.2.0 changed")
    merge = subprocess.run(["git", "merge", "branch"], cwd=repo, capture_output=True, env=ENV)
    assert merge.returncode != 0 and b"CONFLICT (modify/delete): series/index" in merge.stdout
    with pytest.raises(SeriesError, match="series-store"):
        store.read_all(root)
    result = legacy.convert(root)
    assert not result.conflicts
    want = {**ours, "1.0.0": theirs["1.0.0"], "1.1.0": theirs["1.1.0"]}
    assert keys(store.read_all(root)) == keys(want)
    assert store.old_layout(root) == []
    git(repo, "add", "-A", "series")
    git(repo, "commit", "-qm", "merged")
    assert not legacy.convert(root, check=True).change.changed


def test_a_base_both_sides_changed_gets_conflict_markers(tmp_path: Path) -> None:
    repo, root = _repo_with_delta_store(tmp_path)
    git(repo, "checkout", "-q", "-b", "branch")
    theirs = sample()
    _edit(theirs, "1.1.1", 1, b"branch")
    shutil.rmtree(root)
    write_delta_store(root, theirs)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "the branch")
    git(repo, "checkout", "-q", "main")
    legacy.convert(root)
    ours = store.read_all(root)
    _edit(ours, "1.1.1", 1, b"main")
    store.write_store(root, ours)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "converted, then 1.1.1 changed")
    subprocess.run(["git", "merge", "-q", "branch"], cwd=repo, capture_output=True, env=ENV)
    result = legacy.convert(root)
    assert result.conflicts == ["1.1.1"]
    text = (root / "1.1.1" / "series").read_text()
    assert "<<<<<<< series/1.1.1/series" in text and ">>>>>>> series/index" in text
    with pytest.raises(SeriesError, match="a merge conflict"):
        store.read_base(root, "1.1.1")
    # resolved by hand: keep the branch's line; the next run tidies the pool
    lines = text.splitlines()
    start, mid, end = (
        next(i for i, ln in enumerate(lines) if ln.startswith(m)) for m in ("<<<", "===", ">>>")
    )
    (root / "1.1.1" / "series").write_text("\n".join(lines[:start] + lines[mid + 1 : end]) + "\n")
    legacy.convert(root)
    assert store.read_all(root)["1.1.1"].key() == theirs["1.1.1"].key()
    assert keys({v: b for v, b in store.read_all(root).items() if v != "1.1.1"}) == keys(
        {v: b for v, b in sample().items() if v != "1.1.1"}
    )


# --- export ---------------------------------------------------------------------------


def _export_round_trip(fork_repo: ForkRepo, tmp_path: Path) -> Path:
    tree = tmp_path / "tree"
    materialize(fork_repo.config, FAKE_VERSION, tree)
    commit(tree, "Add f3", "Adds f3.", trailer_block(), {"f3.py": "x = 3\n"})
    commit(tree, "Add f4", "Adds f4.", trailer_block(), {"f4.py": "x = 4\n"})
    assert export(fork_repo.config, tree).changed
    return tree


STEMS = ["Add-f3", "Add-f4"]


def test_export_writes_the_store_byte_stable(fork_repo: ForkRepo, tmp_path: Path) -> None:
    tree = _export_round_trip(fork_repo, tmp_path)
    series_root = fork_repo.config.series_root
    assert main(["series-store", "--check"]) == 0
    stored = tree_files(series_root)
    patches = [p.read_bytes() for p in load_series(fork_repo.series_dir()).patches]
    assert set(stored) == {
        f"{FAKE_VERSION}/series",
        *(f"pool/{store.pool_name(s, d)}" for s, d in zip(STEMS, patches, strict=True)),
    }
    # materialize of the stored base gives the same commits; export writes nothing
    again = tmp_path / "again"
    materialize(fork_repo.config, FAKE_VERSION, again)
    assert git(again, "rev-parse", "HEAD^{tree}") == git(tree, "rev-parse", "HEAD^{tree}")
    result = export(fork_repo.config, again)
    assert not result.changed and tree_files(series_root) == stored
    # an edit adds one pool file
    commit(again, "Add f5", "Adds f5.", trailer_block(), {"f5.py": "x = 5\n"})
    result = export(fork_repo.config, again)
    assert result.written == ["0003-Add-f5.patch"]
    added = load_series(fork_repo.series_dir()).patches[2].read_bytes()
    assert result.store.written == [
        f"pool/{store.pool_name('Add-f5', added)}",
        f"{FAKE_VERSION}/series",
    ]
    # an amended commit replaces its pool file: the old one, now unreferenced, goes
    (again / "f5.py").write_text("x = 55\n")
    git(again, "commit", "-q", "-a", "--amend", "--no-edit")
    result = export(fork_repo.config, again)
    assert result.store.removed == [f"pool/{store.pool_name('Add-f5', added)}"]
    files = tree_files(series_root)
    assert len(files) == 4  # the series file + three patches
    shutil.rmtree(again)
    materialize(fork_repo.config, FAKE_VERSION, again)
    assert not export(fork_repo.config, again).changed


def test_a_one_line_change_shows_in_git_diff_as_patch_text(
    fork_repo: ForkRepo, tmp_path: Path
) -> None:
    """What a reviewer reads: the pool file renamed with the changed line, and
    the series file naming the new one."""
    tree = _export_round_trip(fork_repo, tmp_path)
    repo = fork_repo.root
    git(repo, "init", "-q")
    git(repo, "add", "-A", "series")
    git(repo, "commit", "-qm", "series")
    (tree / "f4.py").write_text("x = 44\n")
    git(tree, "commit", "-q", "-a", "--amend", "--no-edit")
    export(fork_repo.config, tree)
    git(repo, "add", "-A", "series")
    diff = git(repo, "diff", "--cached", "-M")
    assert "rename from series/pool/Add-f4." in diff
    assert "\n--x = 4\n+-x = 4\n" not in diff  # the changed line, as the patch's own lines
    assert "\n-+x = 4\n++x = 44\n" in diff
    assert f"--- a/series/{FAKE_VERSION}/series" in diff
    assert "-Add-f4." in diff and "+Add-f4." in diff


def test_a_file_written_by_a_reader_does_not_reach_the_next_reader() -> None:
    """The expanded copies of a series are shared by every reader of the same
    series in a process: one that writes to its patch file must not change what
    the next reader gets."""
    data = b"From 0 Mon Sep 17 00:00:00 2001\nSubject: [Kernel] A\n\nbody\n---\n"
    base = store.BaseSeries(["Kernel-A"], [data], [])
    _, (path,) = store.expand(base)
    assert path.read_bytes() == data
    path.write_bytes(data.replace(b"body", b"edited by a reader"))
    _, (again,) = store.expand(base)
    assert again == path and again.read_bytes() == data
