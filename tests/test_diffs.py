"""The one diff parser (vllm_fork.diffs, on unidiff)."""

from __future__ import annotations

import pytest

from vllm_fork.diffs import HunkInfo, file_hunks, touched_paths
from vllm_fork.errors import SeriesError

PATCH = """\
From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001
Subject: [PATCH] x

A message line that looks like a header:
--- a/not/a/file.py
---
 vllm/a.py | 2 +-
diff --git a/vllm/a.py b/vllm/a.py
index 1111111..2222222 100644
--- a/vllm/a.py
+++ b/vllm/a.py
@@ -1 +1 @@
-x = 1
+x = 2
@@ -10,3 +10,4 @@ def f():
 a
 b
+c
 d
diff --git a/vllm/old.py b/vllm/old.py
deleted file mode 100644
--- a/vllm/old.py
+++ /dev/null
@@ -1,2 +0,0 @@
-gone
-too
diff --git a/tests/new.py b/tests/new.py
new file mode 100644
--- /dev/null
+++ b/tests/new.py
@@ -0,0 +1 @@
+y = 1
--
2.43.0
"""


def test_touched_paths_skip_the_message_and_dev_null() -> None:
    assert touched_paths(PATCH) == ["vllm/a.py", "vllm/old.py", "tests/new.py"]


def test_file_hunks_keep_the_header_as_written() -> None:
    assert file_hunks(PATCH) == {
        "vllm/a.py": [
            HunkInfo(1, 1, "@@ -1 +1 @@"),
            HunkInfo(10, 3, "@@ -10,3 +10,4 @@ def f():"),
        ],
        "vllm/old.py": [HunkInfo(1, 2, "@@ -1,2 +0,0 @@")],
        "tests/new.py": [HunkInfo(0, 0, "@@ -0,0 +1 @@")],
    }


def test_a_hunk_shorter_than_its_header_says_is_an_error() -> None:
    broken = PATCH.replace("@@ -10,3 +10,4 @@", "@@ -10,9 +10,9 @@")
    with pytest.raises(SeriesError, match="0001-x.patch: not a readable unified diff"):
        touched_paths(broken, "0001-x.patch")
