"""Refusal rules of precompiled builds and the fork version label."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_fork.cli.main import main
from vllm_fork.errors import SeriesError, UsageError
from vllm_fork.series.forkversion import (
    check_fork_version,
    fork_version,
    leaves_out,
    series_revision,
)
from vllm_fork.series.patches import load_series, parse_patch, validate_header
from vllm_fork.series.precompiled import precompiled_conflicts, precompiled_reason, touched_paths
from vllm_fork.tree.materialize import materialize
from vllm_fork.wheel.builder import BuildRefused, BuildRequest, prepare

from .buildutil import FULL_PATCH, csrc_patch, full_csrc_patch, make_series, pin_wheel, python_patch
from .conftest import FAKE_VERSION, ForkRepo

PATCH = """\
From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001
Subject: x

---
diff --git a/vllm/a.py b/vllm/a.py
index 1..2 100644
--- a/vllm/a.py
+++ b/vllm/a.py
@@ -1 +1 @@
--- a removed line that looks like a header
+++ an added line that looks like a header
diff --git a/csrc/new.cu b/csrc/new.cu
new file mode 100644
--- /dev/null
+++ b/csrc/new.cu
@@ -0,0 +1 @@
+int x;
diff --git a/cmake/old.cmake b/cmake/old.cmake
deleted file mode 100644
--- a/cmake/old.cmake
+++ /dev/null
@@ -1 +0,0 @@
-x
diff --git a/vllm/third_party/x.py b/vllm/moved.py
similarity index 100%
rename from vllm/third_party/x.py
rename to vllm/moved.py
"""


def test_touched_paths_cover_modify_create_delete_rename() -> None:
    assert touched_paths(PATCH) == [
        "vllm/a.py",
        "csrc/new.cu",
        "cmake/old.cmake",
        "vllm/third_party/x.py",
        "vllm/moved.py",
    ]


@pytest.mark.parametrize(
    ("path", "blocked"),
    [
        ("csrc/pos_encoding_kernels.cu", True),
        ("csrc/libtorch_stable/pos_encoding_kernels.cu", True),
        ("cmake/utils.cmake", True),
        ("CMakeLists.txt", True),
        ("vllm/vllm_flash_attn/flash_attn_interface.py", True),
        ("vllm/third_party/triton_kernels/x.py", True),
        ("vllm/_aiter_ops.py", False),
        ("tests/kernels/test_rope.py", False),
        ("docs/CMakeLists.txt", False),
    ],
)
def test_precompiled_blocks_compiled_and_overwritten_paths(path: str, blocked: bool) -> None:
    assert (precompiled_reason(path) is not None) is blocked


def test_conflicts_name_patch_and_file(tmp_path: Path) -> None:
    patch = tmp_path / "0001-x.patch"
    patch.write_text(PATCH)
    found = {(c.patch, c.path) for c in precompiled_conflicts([patch])}
    assert found == {
        ("0001-x.patch", "csrc/new.cu"),
        ("0001-x.patch", "cmake/old.cmake"),
        ("0001-x.patch", "vllm/third_party/x.py"),
    }


def test_csrc_patch_refuses_precompiled(fork_repo: ForkRepo, tmp_path: Path) -> None:
    pin_wheel(fork_repo)
    make_series(fork_repo, tmp_path, python_patch, csrc_patch)
    with pytest.raises(BuildRefused) as exc:
        prepare(fork_repo.config, BuildRequest(mode="precompiled"))
    message = str(exc.value)
    assert "0002-Kernel-Read-the-cache-in-its-own-dtype.patch: csrc/kernel.cu" in message
    assert "--mode full" in message
    assert "vllm/layer.py" not in message  # the Python patch is fine
    # full and empty builds of the same series are not refused
    assert prepare(fork_repo.config, BuildRequest(mode="full")).version.endswith(".2")
    assert prepare(fork_repo.config, BuildRequest(mode="empty")).plat_name is None


def test_cli_refusal_exit_code(
    fork_repo: ForkRepo, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pin_wheel(fork_repo)
    make_series(fork_repo, tmp_path, csrc_patch)
    assert main(["build", "--dry-run"]) == 1
    err = capsys.readouterr().err
    assert "cannot build vLLM 9.9.9 in precompiled mode" in err
    assert "csrc/kernel.cu" in err


def test_python_only_series_is_allowed(fork_repo: ForkRepo, tmp_path: Path) -> None:
    pin_wheel(fork_repo)
    make_series(fork_repo, tmp_path, python_patch)
    prep = prepare(fork_repo.config, BuildRequest(mode="precompiled"))
    assert prep.version == f"{FAKE_VERSION}+hardened.1"
    assert prep.plat_name == "manylinux_2_28_x86_64"  # the upstream wheel's tag


def test_precompiled_needs_the_devices_wheel_pin(fork_repo: ForkRepo, tmp_path: Path) -> None:
    make_series(fork_repo, tmp_path, python_patch)
    with pytest.raises(BuildRefused, match="pins no upstream wheel"):
        prepare(fork_repo.config, BuildRequest(mode="precompiled"))
    # a ROCm build starts from upstream's ROCm wheel: without its pin, how to add one
    with pytest.raises(UsageError, match="pins no upstream ROCm wheel .* --rocm-index URL"):
        prepare(fork_repo.config, BuildRequest(mode="precompiled", device="rocm"))


def test_version_label() -> None:
    assert fork_version("0.21.0", 3) == "0.21.0+hardened.3"
    assert check_fork_version("0.21.0+hardened.3") == ("0.21.0", 3)
    for bad in ("0.21.0+cpu.1", "0.21.0+hardened", "0.21.0+hardened.x", "0.21.0"):
        with pytest.raises(SeriesError):
            check_fork_version(bad)
    with pytest.raises(SeriesError):
        fork_version("0.21.0+cu130", 1)


def test_series_revision(tmp_path: Path) -> None:
    assert series_revision(tmp_path, 4) == 4  # no revision file: the number of patches
    (tmp_path / "revision").write_text("# bumped for the rebase\n7\n")
    assert series_revision(tmp_path, 4) == 7
    (tmp_path / "revision").write_text("seven\n")
    with pytest.raises(SeriesError, match="one non-negative integer"):
        series_revision(tmp_path, 4)


def test_overwritten_paths_are_listed_in_one_module() -> None:
    import vllm_fork

    src = Path(vllm_fork.__file__).parent
    holders = sorted(
        p.relative_to(src).as_posix()
        for p in src.rglob("*.py")
        if "vllm/third_party/" in p.read_text() or "vllm/vllm_flash_attn/" in p.read_text()
    )
    assert holders == ["series/precompiled.py"]


# --------------------------------------------------------------------------- Fork-Build: full


def test_marked_patch_is_left_out_of_precompiled(fork_repo: ForkRepo, tmp_path: Path) -> None:
    pin_wheel(fork_repo)
    make_series(fork_repo, tmp_path, python_patch, full_csrc_patch)
    prep = prepare(fork_repo.config, BuildRequest(mode="precompiled"))
    assert prep.left_out == (FULL_PATCH,)
    assert prep.version == f"{FAKE_VERSION}+hardened.2.nofull"
    # a full build has every patch and the plain label
    full = prepare(fork_repo.config, BuildRequest(mode="full"))
    assert (full.left_out, full.version) == ((), f"{FAKE_VERSION}+hardened.2")


def test_dry_run_names_the_left_out_patch(
    fork_repo: ForkRepo, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pin_wheel(fork_repo)
    make_series(fork_repo, tmp_path, python_patch, full_csrc_patch)
    assert main(["build", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f"+ 1 patch(es) -> vllm-{FAKE_VERSION}+hardened.2.nofull (precompiled" in out
    assert f"# left out (Fork-Build: full): {FULL_PATCH}" in out
    assert main(["build", "--dry-run", "--mode", "full"]) == 0
    out = capsys.readouterr().out
    assert f"+ 2 patch(es) -> vllm-{FAKE_VERSION}+hardened.2 (full" in out
    assert "left out" not in out


def test_unmarked_csrc_patch_is_still_refused(fork_repo: ForkRepo, tmp_path: Path) -> None:
    pin_wheel(fork_repo)
    make_series(fork_repo, tmp_path, full_csrc_patch, csrc_patch)
    with pytest.raises(BuildRefused) as exc:
        prepare(fork_repo.config, BuildRequest(mode="precompiled"))
    message = str(exc.value)
    assert "0002-Kernel-Read-the-cache-in-its-own-dtype.patch: csrc/kernel.cu" in message
    assert "csrc/fast.cu" not in message  # the marked patch is left out, not refused


def test_materialize_leaves_out_only_in_internal_trees(fork_repo: ForkRepo, tmp_path: Path) -> None:
    make_series(fork_repo, tmp_path, python_patch, full_csrc_patch)
    with pytest.raises(UsageError, match="only the tool's own build trees"):
        materialize(fork_repo.config, None, tmp_path / "user", exclude=[FULL_PATCH])
    work = fork_repo.config.cache.work / "t"
    result = materialize(fork_repo.config, None, work, internal=True, exclude=[FULL_PATCH])
    assert result.applied == 1
    assert not (work / "csrc/fast.cu").exists()
    with pytest.raises(SeriesError, match="no patch 0009-x.patch to leave out"):
        materialize(
            fork_repo.config, None, work.parent / "u", internal=True, exclude=["0009-x.patch"]
        )


def test_fork_build_header_values(fork_repo: ForkRepo, tmp_path: Path) -> None:
    make_series(fork_repo, tmp_path, full_csrc_patch)
    series = load_series(fork_repo.series_dir())
    assert [h.build for h in series.headers] == ["full"]
    assert series.without([series.patches[0].name]).patches == ()
    patch = series.patches[0]
    patch.write_text(patch.read_text().replace("Fork-Build: full", "Fork-Build: sometimes"))
    with pytest.raises(SeriesError, match="unknown Fork-Build 'sometimes'"):
        validate_header(parse_patch(patch))
    patch.write_text(patch.read_text().replace("Fork-Build: sometimes\n", ""))
    assert parse_patch(patch).build == "any"  # the default


def test_nofull_label() -> None:
    label = fork_version("0.21.0", 14, left_out=True)
    assert label == "0.21.0+hardened.14.nofull"
    assert check_fork_version(label) == ("0.21.0", 14)
    assert leaves_out(label) and not leaves_out("0.21.0+hardened.14")
    with pytest.raises(SeriesError):
        check_fork_version("0.21.0+hardened.14.full")
