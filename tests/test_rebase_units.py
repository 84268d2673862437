"""Small pieces of rebase and matrix: conflict parsing, series records, moved files."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_fork.errors import SeriesError
from vllm_fork.rebase.conflicts import parse_markers
from vllm_fork.reports.matrix import find_moves, retarget
from vllm_fork.series.history import Absorbed, add_applied_upstream, write_series_history
from vllm_fork.series.patches import parse_patch

PATCH = """\
From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001
From: vLLM ROCm fork maintainers <rocm-fork-maintainers@users.noreply.github.com>
Date: Sat, 21 Nov 2026 12:00:00 +0000
Subject: [ROCm] Precast the bias once

Casts once at construction.

Fork-Change: moe-bias-precast
Fork-Part: change
Origin: backport, https://github.com/vllm-project/vllm/pull/39999
Forwarded: no
---
 vllm/moe.py | 2 +-
 1 file changed, 1 insertion(+), 1 deletion(-)

diff --git a/vllm/moe.py b/vllm/moe.py
index 1111111111111111111111111111111111111111..2222222222222222222222222222222222222222 100644
--- a/vllm/moe.py
+++ b/vllm/moe.py
@@ -1,3 +1,3 @@
 a
-b
+c
 ---
"""


def test_parse_markers_diff3() -> None:
    text = "\n".join(
        [
            "keep",
            "<<<<<<< HEAD:vllm/a.py",
            "ours 1",
            "ours 2",
            "||||||| parent of 1234567 (patch):vllm/a.py",
            "base",
            "=======",
            "theirs",
            ">>>>>>> 1234567 (patch):vllm/a.py",
            "tail",
            "<<<<<<< HEAD",
            "=======",
            "added by the patch",
            ">>>>>>> 1234567 (patch)",
        ]
    )
    first, second = parse_markers(text)
    assert (first.start, first.end) == (2, 9)
    assert first.ours == ["ours 1", "ours 2"] and first.theirs == ["theirs"]
    assert (second.start, second.end) == (11, 14)
    assert second.ours == [] and second.theirs == ["added by the patch"]
    assert parse_markers("no conflict here\n") == []


def test_applied_upstream_trailer_keeps_the_first_release(tmp_path: Path) -> None:
    patch = tmp_path / "0001-ROCm-Precast-the-bias-once.patch"
    patch.write_text(PATCH)
    assert add_applied_upstream(patch, "0.22.0")
    text = patch.read_text()
    assert text == PATCH.replace("Forwarded: no\n", "Forwarded: no\nApplied-Upstream: 0.22.0\n")
    assert parse_patch(patch).applied_upstream == "0.22.0"
    assert not add_applied_upstream(patch, "0.22.0")  # idempotent
    # A later rebase straight onto a newer release keeps the first one ...
    assert not add_applied_upstream(patch, "0.33.0")
    assert parse_patch(patch).applied_upstream == "0.22.0"
    # ... and an earlier release found later replaces it.
    assert add_applied_upstream(patch, "0.21.1")
    assert patch.read_text().count("Applied-Upstream:") == 1
    assert parse_patch(patch).applied_upstream == "0.21.1"
    # The diff, including its "--- " lines inside hunks, is untouched.
    assert patch.read_text().split("\n---\n", 1)[1] == PATCH.split("\n---\n", 1)[1]


def test_applied_upstream_refuses_a_non_patch(tmp_path: Path) -> None:
    bad = tmp_path / "bad.patch"
    bad.write_text("just text\n")
    with pytest.raises(SeriesError):
        add_applied_upstream(bad, "0.22.0")
    assert bad.read_text() == "just text\n"


def test_series_history_block_is_replaced(tmp_path: Path) -> None:
    series = tmp_path / "series"
    series.write_text("# header\n0001-a.patch\n0002-b.patch\n")
    entry = Absorbed("0003-c.patch", "ar-rms-pack-gate", "change", "upstream has\nit")
    write_series_history(tmp_path, "0.22.0", [entry])
    once = series.read_text()
    assert once.splitlines()[0] == "# header"
    line = "# Applied-Upstream: 0.22.0 <- 0003-c.patch (ar-rms-pack-gate, change): upstream has it"
    assert line + "\n" in once
    assert once.splitlines()[-2:] == ["0001-a.patch", "0002-b.patch"]
    write_series_history(tmp_path, "0.22.0", [entry])
    assert series.read_text() == once
    skipped = Absorbed("0004-d.patch", "dsv32-decode", "hardening", "dropped", by_hand=True)
    write_series_history(tmp_path, "0.22.0", [entry, skipped])
    assert "# Dropped-By-Hand: 0.22.0 <- 0004-d.patch (dsv32-decode, hardening): dropped\n" in (
        series.read_text()
    )
    write_series_history(tmp_path, "0.22.0", [])
    assert series.read_text() == "# header\n0001-a.patch\n0002-b.patch\n"


def test_moved_files_are_found_by_unique_name() -> None:
    paths = ["csrc/libtorch_stable/pos_encoding_kernels.cu", "vllm/a/util.py", "vllm/b/util.py"]
    assert find_moves(["csrc/pos_encoding_kernels.cu", "vllm/util.py", "gone.py"], paths) == {
        "csrc/pos_encoding_kernels.cu": "csrc/libtorch_stable/pos_encoding_kernels.cu"
    }
    moved = retarget(PATCH.encode(), {"vllm/moe.py": "vllm/x/moe.py"}).decode()
    assert "diff --git a/vllm/x/moe.py b/vllm/x/moe.py\n" in moved
    assert "--- a/vllm/x/moe.py\n+++ b/vllm/x/moe.py\n" in moved
    assert " vllm/moe.py | 2 +-" in moved  # the diffstat is not a header
