"""Small pieces of rebase: conflict parsing."""

from __future__ import annotations

from vllm_fork.rebase.conflicts import parse_markers


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
