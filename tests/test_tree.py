from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from vllm_fork.errors import ExportRefusedError, PatchFailedError, WorkTreeError
from vllm_fork.facts.names import tag_for
from vllm_fork.series import store
from vllm_fork.series.patches import load_series, parse_patch
from vllm_fork.tree.export import export
from vllm_fork.tree.materialize import materialize

from .conftest import FAKE_VERSION, ForkRepo
from .gitutil import DATE, commit, git, trailer_block
from .seriesutil import edit_stored, patch_names, stored_patch, tree_files


def make_series(repo: ForkRepo, tmp_path: Path) -> Path:
    """Materialize, commit two fork patches, export; return the work tree."""
    tree = tmp_path / "wt"
    materialize(repo.config, None, tree)
    layer = (tree / "vllm/layer.py").read_text()
    commit(
        tree,
        "[ROCm] Change f3",
        "Make f3 add more.",
        trailer_block(),
        {"vllm/layer.py": layer.replace("return x + 3\n", "return x + 33\n")},
    )
    commit(
        tree,
        "[ROCm][Tests] Cover f3",
        "Tests for f3.",
        trailer_block(part="tests", origin="vendor"),
        {"tests/test_f3.py": "def test_f3():\n    assert True\n"},
    )
    export(repo.config, tree)
    return tree


def test_materialize_layout_and_commits(fork_repo: ForkRepo, tmp_path: Path) -> None:
    tree = tmp_path / "plain"
    result = materialize(fork_repo.config, None, tree)
    assert result.applied == 0
    assert sorted(p.name for p in tree.iterdir()) == [
        ".git",
        "PKG-INFO",
        "csrc",
        "setup.py",
        "vllm",
    ]
    assert git(tree, "tag").split() == [tag_for(FAKE_VERSION)]
    assert git(tree, "remote").strip() == ""
    assert git(tree, "rev-parse", "--abbrev-ref", "HEAD").strip() == "fork"
    assert git(tree, "config", "vllm-fork.base").strip() == FAKE_VERSION
    log = git(tree, "log", "--format=%an|%at|%P", "upstream/9.9.9").strip()
    assert log == "vLLM upstream|1700000000|"  # PKG-INFO mtime, no parent


def test_import_is_deterministic(fork_repo: ForkRepo, tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    materialize(fork_repo.config, None, a)
    # a fresh cache imports the same sdist to the same commit id
    import dataclasses

    other = dataclasses.replace(fork_repo.config, cache_dir=tmp_path / "cache2")
    materialize(other, None, b)
    assert git(a, "rev-parse", "HEAD") == git(b, "rev-parse", "HEAD")


def test_export_round_trip_is_byte_stable(fork_repo: ForkRepo, tmp_path: Path) -> None:
    make_series(fork_repo, tmp_path)
    series_dir = fork_repo.series_dir()
    names = patch_names(series_dir)
    assert names == ["0001-ROCm-Change-f3.patch", "0002-ROCm-Tests-Cover-f3.patch"]
    before = tree_files(fork_repo.config.series_root)
    header = parse_patch(stored_patch(series_dir, names[0]))
    assert header.subject == "[ROCm] Change f3" and header.change == "ar-rms-pack-gate"
    assert header.date == "Sat, 21 Nov 2026 12:00:00 +0000"

    again = tmp_path / "again"
    result = materialize(fork_repo.config, None, again)
    assert result.applied == 2
    assert "return x + 33" in (again / "vllm/layer.py").read_text()
    assert git(again, "log", "-1", "--format=%cn|%cI").strip() == (
        f"vLLM ROCm fork maintainers|{DATE}"
    )
    exported = export(fork_repo.config, again)
    assert not exported.changed
    assert tree_files(fork_repo.config.series_root) == before

    # the same series materializes to the same commits every time
    third = tmp_path / "third"
    materialize(fork_repo.config, None, third)
    assert git(third, "rev-parse", "HEAD") == git(again, "rev-parse", "HEAD")


def test_export_in_git_repo_leaves_status_clean(fork_repo: ForkRepo, tmp_path: Path) -> None:
    subprocess.run(["git", "init", "-q"], cwd=fork_repo.root, check=True)
    tree = make_series(fork_repo, tmp_path)
    git(fork_repo.root, "add", "-A")
    git(fork_repo.root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "series")
    export(fork_repo.config, tree)
    assert git(fork_repo.root, "status", "--porcelain") == ""


def test_export_removes_stale_and_refuses_dirty(fork_repo: ForkRepo, tmp_path: Path) -> None:
    tree = make_series(fork_repo, tmp_path)
    git(tree, "reset", "-q", "--hard", "HEAD~1")
    # Dropping a patch is refused unless forced, and nothing is written.
    with pytest.raises(ExportRefusedError, match="would drop 1 patch.*0002-ROCm-Tests-Cover-f3"):
        export(fork_repo.config, tree)
    assert len(load_series(fork_repo.series_dir()).patches) == 2
    result = export(fork_repo.config, tree, force=True)
    assert result.removed == ["0002-ROCm-Tests-Cover-f3.patch"]
    assert [p.name for p in load_series(fork_repo.series_dir()).patches] == [
        "0001-ROCm-Change-f3.patch"
    ]
    (tree / "vllm/layer.py").write_text("dirty\n")
    before = tree_files(fork_repo.config.series_root)
    with pytest.raises(ExportRefusedError, match="(?s)uncommitted changes.*M vllm/layer.py"):
        export(fork_repo.config, tree)
    assert tree_files(fork_repo.config.series_root) == before


def test_export_keeps_history_comments_when_the_list_changes(
    fork_repo: ForkRepo, tmp_path: Path
) -> None:
    tree = make_series(fork_repo, tmp_path)
    series_file = fork_repo.series_dir() / "series"
    history = "# Applied-Upstream: 9.9.9 <- 0009-Old.patch (ar-rms-pack-gate, change): probe\n"
    series_file.write_text(series_file.read_text() + history)
    git(tree, "reset", "-q", "--hard", "HEAD~1")
    result = export(fork_repo.config, tree, force=True)
    assert result.series_changed
    text = series_file.read_text()
    assert text.startswith(store.HEADER + history)
    assert text.endswith(
        f"{stored_patch(fork_repo.series_dir(), '0001-ROCm-Change-f3.patch').name}\n"
    )
    assert text.count(store.HEADER) == 1


def test_export_rejects_commit_without_header(fork_repo: ForkRepo, tmp_path: Path) -> None:
    tree = tmp_path / "wt"
    materialize(fork_repo.config, None, tree)
    commit(tree, "No trailers", "Body.", "", {"vllm/new.py": "x = 1\n"})
    with pytest.raises(ExportRefusedError, match="missing header field"):
        export(fork_repo.config, tree)
    assert not fork_repo.series_dir().exists()


def test_materialize_refuses_non_empty_dir(fork_repo: ForkRepo, tmp_path: Path) -> None:
    target = tmp_path / "full"
    target.mkdir()
    (target / "keep.txt").write_text("mine")
    with pytest.raises(WorkTreeError, match="is not empty; refusing"):
        materialize(fork_repo.config, None, target)
    assert [p.name for p in target.iterdir()] == ["keep.txt"]
    assert (target / "keep.txt").read_text() == "mine"


def test_materialize_into_empty_dir(fork_repo: ForkRepo, tmp_path: Path) -> None:
    target = tmp_path / "empty"
    target.mkdir()
    materialize(fork_repo.config, None, target)
    assert (target / "vllm" / "layer.py").is_file()


def break_first_patch(repo: ForkRepo) -> None:
    def broken(data: bytes) -> bytes:
        text = data.decode()
        # the hunk now expects context that upstream does not have, and its blob ids are unknown
        text = text.replace("\n def f3(x):", "\n def f3(y):")
        text = "\n".join(
            line
            if not line.startswith("index ")
            else "index " + "1" * 40 + ".." + "2" * 40 + " 100644"
            for line in text.split("\n")
        )
        return text.encode()

    edit_stored(repo.series_dir(), "0001-ROCm-Change-f3.patch", broken)


def test_failing_patch_is_reported_and_dir_removed(fork_repo: ForkRepo, tmp_path: Path) -> None:
    make_series(fork_repo, tmp_path)
    break_first_patch(fork_repo)
    target = tmp_path / "fails"
    with pytest.raises(PatchFailedError) as err:
        materialize(fork_repo.config, None, target)
    message = str(err.value)
    assert "patch 0001-ROCm-Change-f3.patch (#1 of 2) does not apply" in message
    assert "vllm/layer.py: hunk @@ -" in message
    assert "was not created (use --keep-failed to keep the partial tree)" in message
    assert not target.exists()


def test_failing_patch_keep_failed(fork_repo: ForkRepo, tmp_path: Path) -> None:
    make_series(fork_repo, tmp_path)
    break_first_patch(fork_repo)
    target = tmp_path / "kept"
    with pytest.raises(PatchFailedError, match="kept for inspection"):
        materialize(fork_repo.config, None, target, keep_failed=True)
    assert git(target, "rev-parse", "HEAD") == git(target, "rev-parse", "upstream/9.9.9")
    assert git(target, "status", "--porcelain") == ""


def test_renames_round_trip_and_match_documented_command(
    fork_repo: ForkRepo, tmp_path: Path
) -> None:
    tree = tmp_path / "wt"
    materialize(fork_repo.config, None, tree)
    git(tree, "mv", "csrc/kernel.cu", "csrc/kernels.cu")
    commit(
        tree,
        "[ROCm] Rename the kernel",
        "Move it.",
        trailer_block(part="support", origin="vendor", change="rocm-sim"),
        {"vllm/extra.py": "y = 2\n"},
    )
    export(fork_repo.config, tree)
    name = "0001-ROCm-Rename-the-kernel.patch"
    patch = stored_patch(fork_repo.series_dir(), name)
    assert "rename from csrc/kernel.cu" in patch.read_text()
    # the command docs/series-format.md gives produces the same bytes
    plain = tmp_path / "plain"
    subprocess.run(
        [
            "git",
            "format-patch",
            "--keep-subject",
            "--zero-commit",
            "--no-signature",
            "--full-index",
            "-q",
            "-o",
            str(plain),
            "upstream/9.9.9..HEAD",
        ],
        cwd=tree,
        check=True,
    )
    assert (plain / name).read_bytes() == patch.read_bytes()
    again = tmp_path / "again"
    materialize(fork_repo.config, None, again)
    assert (again / "csrc/kernels.cu").is_file() and not (again / "csrc/kernel.cu").exists()
    assert not export(fork_repo.config, again).changed


def test_export_refuses_paths_the_build_overwrites(fork_repo: ForkRepo, tmp_path: Path) -> None:
    tree = tmp_path / "wt"
    materialize(fork_repo.config, None, tree)
    commit(
        tree,
        "[ROCm] Touch vendored code",
        "No.",
        trailer_block(),
        {"vllm/third_party/x.py": "z = 1\n"},
    )
    with pytest.raises(ExportRefusedError, match="must not change paths.*vllm/third_party/x.py"):
        export(fork_repo.config, tree)


def test_every_export_refusal_exits_2_as_the_readme_says(
    fork_repo: ForkRepo, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """README: "2 bad usage or a refused request". Each way export refuses a tree
    (dirty, mid-merge, a path the build overwrites, a bad header, dropped patches)
    exits 2 with one error line, and writes nothing."""
    from vllm_fork.cli.main import main

    def refused(tree: Path, what: str) -> None:
        assert main(["export", str(tree)]) == 2, what
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("vllm-fork: error: "), (what, err)
        assert not fork_repo.series_dir().exists(), what

    tree = tmp_path / "wt"
    materialize(fork_repo.config, None, tree)
    capsys.readouterr()  # the download line of a first materialize
    (tree / "vllm/layer.py").write_text("dirty\n")
    refused(tree, "a dirty tree")
    git(tree, "checkout", "-q", "vllm/layer.py")
    commit(tree, "No trailers", "Body.", "", {"vllm/new.py": "x = 1\n"})
    refused(tree, "a bad header")
    git(tree, "reset", "-q", "--hard", "HEAD~1")
    commit(tree, "[ROCm] Vendored", "No.", trailer_block(), {"vllm/third_party/x.py": "z\n"})
    refused(tree, "a path the precompiled build overwrites")
    git(tree, "reset", "-q", "--hard", "HEAD~1")
    git_dir = tree / git(tree, "rev-parse", "--git-dir").strip()
    (git_dir / "MERGE_HEAD").write_text(git(tree, "rev-parse", "HEAD"))
    refused(tree, "a merge in progress")


def test_export_refuses_an_overwritten_path_a_later_patch_removes(
    fork_repo: ForkRepo, tmp_path: Path
) -> None:
    # Each patch file would still carry the change, so the series is refused
    # even though the tree at HEAD no longer differs there.
    tree = tmp_path / "wt"
    materialize(fork_repo.config, None, tree)
    commit(
        tree,
        "[ROCm] Add to flash-attn",
        "No.",
        trailer_block(),
        {"vllm/vllm_flash_attn/x.py": "1\n"},
    )
    (tree / "vllm/vllm_flash_attn/x.py").unlink()
    commit(tree, "[ROCm] Take it back", "No.", trailer_block(), {})
    with pytest.raises(
        ExportRefusedError, match="must not change paths.*vllm/vllm_flash_attn/x.py"
    ):
        export(fork_repo.config, tree)


def test_only_the_tools_own_trees_may_live_in_its_work_area(fork_repo: ForkRepo) -> None:
    """A build tree goes into <cache>/work; a user's DIR anywhere in the cache is refused."""
    inside = fork_repo.config.cache.work / "build-x" / "src"
    with pytest.raises(WorkTreeError, match="inside the vllm-fork cache"):
        materialize(fork_repo.config, None, inside)
    assert materialize(fork_repo.config, None, inside, internal=True).path == inside
    # whose it is, for `vllm-fork cache prune` (a user's tree records no pid)
    assert git(inside, "config", "--get", "vllm-fork.pid").strip() == str(os.getpid())
    elsewhere = fork_repo.config.cache.tmp / "tree"
    with pytest.raises(WorkTreeError, match="inside the vllm-fork cache"):
        materialize(fork_repo.config, None, elsewhere, internal=True)


def test_export_refuses_an_author_the_series_check_would_reject(
    fork_repo: ForkRepo, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A patch is From: the fork; export says so at once instead of writing a
    patch that series.credits rejects later."""
    from vllm_fork.cli.main import main

    tree = tmp_path / "tree"
    materialize(fork_repo.config, None, tree)
    commit(tree, "Gate it", "Why.", trailer_block(), {"vllm/layer.py": "x = 1\n"})
    git(tree, "commit", "-q", "--amend", "--no-edit", "--author=Someone <someone@example.com>")
    assert main(["export", str(tree)]) == 2  # a refused request (README)
    err = capsys.readouterr().err
    assert "must be authored by 'vLLM ROCm fork maintainers <" in err
    assert "'Gate it' by 'Someone <someone@example.com>'" in err
    assert not fork_repo.series_dir().exists() or not any(fork_repo.series_dir().glob("*.patch"))


def test_a_plain_git_commit_works_in_a_tree_on_a_machine_without_identity(
    fork_repo: ForkRepo, tmp_path: Path
) -> None:
    """materialize gives its tree the fork's identity (repository-local), so a
    plain `git commit` works with an empty HOME and no system config, and export
    takes the commit as the fork's."""
    import os

    tree = tmp_path / "tree"
    materialize(fork_repo.config, None, tree)
    home = tmp_path / "home"
    home.mkdir()
    bare = {
        k: v for k, v in os.environ.items() if not k.startswith(("GIT_AUTHOR", "GIT_COMMITTER"))
    }
    env = {**bare, "HOME": str(home), "GIT_CONFIG_NOSYSTEM": "1", "XDG_CONFIG_HOME": str(home)}
    layer = tree / "vllm/layer.py"
    layer.write_text(layer.read_text().replace("return x + 3\n", "return x + 33\n"))
    message = "[ROCm] Change f3\n\nMake f3 add more.\n\n" + trailer_block()
    for args in (["add", "-A"], ["commit", "-q", "-m", message]):
        proc = subprocess.run(["git", *args], cwd=tree, env=env, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
    author = git(tree, "log", "-1", "--format=%an <%ae>").strip()
    assert author == "vLLM ROCm fork maintainers <rocm-fork-maintainers@users.noreply.github.com>"
    export(fork_repo.config, tree)
    assert [h.subject for h in load_series(fork_repo.series_dir()).headers] == ["[ROCm] Change f3"]
