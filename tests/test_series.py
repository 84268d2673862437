from __future__ import annotations

import re
from pathlib import Path

import pytest

from vllm_fork.errors import SeriesError
from vllm_fork.series import store
from vllm_fork.series.patches import load_series, parse_patch, validate_header

PATCH = """\
From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001
From: vLLM ROCm fork maintainers <rocm-fork-maintainers@users.noreply.github.com>
Date: Sat, 21 Nov 2026 12:00:00 +0000
Subject: [ROCm][AITER] Widen the fused allreduce+RMSNorm gate to any
 packable hidden size

The 1-stage kernel was gated by a whitelist.

Fork-Change: ar-rms-pack-gate
Fork-Part: change
Origin: backport, https://github.com/vllm-project/vllm/pull/42409
Bug: https://github.com/vllm-project/vllm/issues/1
Forwarded: no
Applied-Upstream: 0.22.0
Fork-Patch: ar-rms-pack-gate
---
 vllm/_aiter_ops.py | 1 +
 1 file changed, 1 insertion(+)

diff --git a/vllm/_aiter_ops.py b/vllm/_aiter_ops.py
index 1111111111111111111111111111111111111111..2222222222222222222222222222222222222222 100644
--- a/vllm/_aiter_ops.py
+++ b/vllm/_aiter_ops.py
@@ -1,1 +1,2 @@
 x = 1
+y = 2
"""


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_parse_header_fields(tmp_path: Path) -> None:
    header = parse_patch(write(tmp_path / "0001-x.patch", PATCH))
    assert header.subject == (
        "[ROCm][AITER] Widen the fused allreduce+RMSNorm gate to any packable hidden size"
    )
    assert header.author.startswith("vLLM ROCm fork maintainers")
    assert header.change == "ar-rms-pack-gate"
    assert header.part == "change"
    assert header.origin == "backport, https://github.com/vllm-project/vllm/pull/42409"
    assert header.bug == "https://github.com/vllm-project/vllm/issues/1"
    assert header.forwarded == "no"
    assert header.applied_upstream == "0.22.0"
    assert header.patch_id == "ar-rms-pack-gate"
    assert header.body.startswith("The 1-stage kernel")
    validate_header(header)


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ("Forwarded: no\n", "", "0001-x.patch: missing header field.*Forwarded"),
        (
            "Fork-Change: ar-rms-pack-gate",
            "Fork-Change: nonsense",
            "0001-x.patch: unknown Fork-Change 'nonsense'",
        ),
        ("Fork-Part: change", "Fork-Part: whatever", "0001-x.patch: unknown Fork-Part"),
        ("Origin: backport, https", "Origin: somewhere https", "0001-x.patch: Origin must be"),
    ],
)
def test_invalid_headers_name_the_file(tmp_path: Path, old: str, new: str, message: str) -> None:
    header = parse_patch(write(tmp_path / "0001-x.patch", PATCH.replace(old, new)))
    with pytest.raises(SeriesError, match=message):
        validate_header(header)


def test_not_a_patch(tmp_path: Path) -> None:
    with pytest.raises(SeriesError, match="junk.patch: not a git format-patch file"):
        parse_patch(write(tmp_path / "junk.patch", "hello\n"))


def test_a_series_is_read_in_its_series_file_order(tmp_path: Path) -> None:
    root = tmp_path / "series"
    b, a = PATCH.replace("x = 1", "x = 2"), PATCH
    store.write_store(
        root, {"1.0": store.BaseSeries(["b", "a"], [b.encode(), a.encode()], ["# comment"])}
    )
    series = load_series(root / "1.0")
    assert [p.name for p in series.patches] == ["0001-b.patch", "0002-a.patch"]
    assert [p.read_text() for p in series.patches] == [b, a]
    assert series.comments == ("# comment",)
    assert load_series(root / "2.0").patches == ()  # no series file: an empty series


def test_a_patch_without_an_id_is_valid_and_has_none(tmp_path: Path) -> None:
    header = parse_patch(
        write(tmp_path / "0001-x.patch", PATCH.replace("Fork-Patch: ar-rms-pack-gate\n", ""))
    )
    assert header.patch_id is None
    validate_header(header)


ROOT = Path(__file__).resolve().parents[1]
PATCH_ID = re.compile(r"[a-z0-9]+(-[a-z0-9]+)*")


def test_every_committed_patch_has_one_stable_id() -> None:
    assert patch_id_problems(ROOT) == []


def patch_id_problems(root: Path) -> list[str]:
    """Each patch of every series of the repository at ``root`` names its logical
    patch once (Fork-Patch), ids are unique within a series, and one id means one
    change and part on every base."""
    seen: dict[str, tuple[str, str, str]] = {}
    problems: list[str] = []
    for version in store.versions(root / "series"):
        series_dir = root / "series" / version
        ids: list[str] = []
        for header in load_series(series_dir).headers:
            values = header.values("Fork-Patch")
            where = f"{series_dir.name}/{header.file}"
            if len(values) != 1 or not PATCH_ID.fullmatch(values[0]):
                problems.append(f"{where}: Fork-Patch {values!r}")
                continue
            ids.append(values[0])
            first = seen.setdefault(values[0], (header.change, header.part, where))
            if first[:2] != (header.change, header.part):
                problems.append(f"{where}: {values[0]} is {first[:2]} in {first[2]}")
        if len(ids) != len(set(ids)):
            problems.append(f"{series_dir.name}: an id twice: {sorted(ids)}")
    return problems


def test_the_trailers_change_add_prints_make_a_complete_header(tmp_path: Path) -> None:
    """What `vllm-fork change add` tells to commit with passes export's header check
    and carries the Fork-Patch id every committed patch needs."""
    from vllm_fork.series.patches import REQUIRED, local_change_trailers

    trailers = local_change_trailers("banner-log")
    assert set(REQUIRED) <= {key for key, _ in trailers}
    block = "".join(f"{key}: {value}\n" for key, value in trailers)
    body = PATCH[PATCH.index("Fork-Change:") : PATCH.index("---\n")]
    write(tmp_path / "0001-x.patch", PATCH.replace(body, block))
    header = parse_patch(tmp_path / "0001-x.patch")
    validate_header(header, ("banner-log",))
    assert header.patch_id == "banner-log" and PATCH_ID.fullmatch(header.patch_id)
