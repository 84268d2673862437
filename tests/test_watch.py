"""``vllm-fork watch``: upstream's changes to the code the fork touches, per base,
with the triage file deciding each one once.

Synthetic releases (tests/rebase_support.py), a made-up AITER repository and a
made-up clone of upstream vLLM: a change to a watched function is a candidate,
one to another function is not, triage removes it, and a new patch on a new
function is watched with no new configuration."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from vllm_fork.cli.main import main
from vllm_fork.errors import ConfigError
from vllm_fork.facts.triage import parse_triage
from vllm_fork.probes.pyast import MODULE, unit_at, unit_digests, unit_spans
from vllm_fork.reports.watch import format_ranges, patch_units, watch
from vllm_fork.sources.workspace import load_config

from .rebase_support import PatchSpec, git, make_fork


def layer(changed: dict[int, str] | None = None) -> str:
    """vllm/layer.py: f0..f5, each ``return x + N`` unless ``changed`` says otherwise."""
    changed = changed or {}
    return "".join(f"def f{i}(x):\n    return {changed.get(i, f'x + {i}')}\n\n\n" for i in range(6))


DOCKERFILE = 'ARG AITER_BRANCH="v0.1.0"\nFROM scratch\n'
V1, V2, V3 = "1.0.0", "1.1.0", "1.2.0"
RELEASES = {
    V1: {"vllm/layer.py": layer(), "docker/Dockerfile.rocm_base": DOCKERFILE},
    # f1 (patched by the fork) and f4 (not touched by it) change upstream
    V2: {
        "vllm/layer.py": layer({1: "x + 100", 4: "x * 4"}),
        "docker/Dockerfile.rocm_base": DOCKERFILE,
    },
    # f3 changes upstream; a comment-only change to f2 is no change of code
    V3: {
        "vllm/layer.py": layer({1: "x + 100", 4: "x * 4", 3: "x - 3"}).replace(
            "def f2(x):\n", "def f2(x):\n    # reworded comment\n"
        ),
        "docker/Dockerfile.rocm_base": 'ARG AITER_BRANCH="v0.1.1"\nFROM scratch\n',
    },
}

PATCH_F1 = PatchSpec(
    "[ROCm] Patch f1", "ar-rms-pack-gate", "hardening", {"vllm/layer.py": {6: "    return x + 11"}}
)
PATCH_F3 = PatchSpec(
    "[ROCm] Patch f3", "ar-rms-pack-gate", "hardening", {"vllm/layer.py": {14: "    return x + 33"}}
)


def f1_candidate(old: str = V1, new: str = V2) -> str:
    return f"vllm/{old}..{new}/vllm/layer.py:f1"


def make_aiter(tmp: Path) -> tuple[Path, str]:
    """An AITER repository: v0.1.0, then a fix of the watched kernel (tag
    v0.1.1), then an unrelated change on main. Returns it and the fix's sha."""
    repo = tmp / "aiter"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "csrc").mkdir()
    (repo / "csrc/ar.cu").write_text("// allreduce\n")
    (repo / "README").write_text("aiter\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "first")
    git(repo, "tag", "v0.1.0")
    (repo / "csrc/ar.cu").write_text("// allreduce\n// end barrier\n")
    git(repo, "commit", "-q", "-am", "fix the end barrier (#1)")
    fix = git(repo, "rev-parse", "HEAD")
    git(repo, "tag", "v0.1.1")
    (repo / "README").write_text("aiter, documented\n")
    git(repo, "commit", "-q", "-am", "docs")
    return repo, fix


TRIAGE_HEAD = """
[[watch.aiter]]
what = "allreduce"
units = ["csrc/ar.cu"]
reached = { file = "vllm/layer.py", match = 'def f1', why = "f1 calls it" }
"""


@pytest.fixture
def fork(tmp_path, monkeypatch):
    fork = make_fork(tmp_path, monkeypatch, RELEASES, default=V1)
    fork.write_series(V1, [PATCH_F1])
    (fork.root / "upstream-triage.toml").write_text(TRIAGE_HEAD)
    return fork


def ids(report) -> list[str]:
    return [c.id for c in report.candidates]


def test_a_change_to_a_watched_function_is_a_candidate(fork):
    report = watch(load_config())
    assert f1_candidate() in ids(report)
    (f1,) = [c for c in report.candidates if c.id == f1_candidate()]
    assert f1.bases == (V1,)
    # f4 is not the fork's code, f2's change is a comment: neither is a candidate
    assert not [i for i in ids(report) if ":f4" in i or ":f2" in i]
    # without an AITER clone, the AITER side is said to be not covered
    assert any(line.startswith("AITER:") for line in report.not_covered)
    assert not report.ok


def test_triage_removes_a_candidate_and_a_new_patch_is_watched_unconfigured(fork):
    triage = fork.root / "upstream-triage.toml"
    triage.write_text(
        TRIAGE_HEAD
        + f'[[triage]]\ncandidates = ["{f1_candidate()}"]\n'
        + 'not_relevant = "a made-up refactor"\n'
    )
    report = watch(load_config())
    assert f1_candidate() not in [c.id for c in report.untriaged]
    assert f1_candidate() in ids(report)  # still listed with its decision (--all)
    assert not [i for i in ids(report) if ":f3" in i]
    # a second patch, on f3: its upstream change in 1.2.0 is now a candidate for 1.0.0
    shutil.rmtree(fork.tmp / f"author-{V1}")
    fork.write_series(V1, [PATCH_F3])  # materialize carries the f1 patch
    report = watch(load_config())
    assert "vllm/1.1.0..1.2.0/vllm/layer.py:f3" in [c.id for c in report.untriaged]


def test_aiter_commits_the_pinned_tag_lacks(fork, tmp_path):
    aiter, fix = make_aiter(tmp_path)
    report = watch(load_config(), aiter_repo=str(aiter))
    aiter_ids = [c for c in report.candidates if c.source == "aiter"]
    # the fix is missing from v0.1.0 (1.0.0 and 1.1.0 pin it), present in 1.2.0's
    # pin; the docs commit touches nothing watched; 1.1.0 and 1.2.0 have no series,
    # but their upstream f1 still reaches the kernel
    assert [(c.id, c.bases) for c in aiter_ids] == [(f"aiter/{fix[:12]}", (V1, V2))]
    assert "v0.1.1" in aiter_ids[0].summary
    assert report.aiter == {V1: "v0.1.0", V2: "v0.1.0", V3: "v0.1.1"}


def test_cli_exit_status_follows_what_is_left(fork, tmp_path, capsys):
    aiter, fix = make_aiter(tmp_path)
    assert main(["watch", "--aiter-repo", str(aiter)]) == 1
    out = capsys.readouterr().out
    assert f1_candidate() in out and f"aiter/{fix[:12]}" in out
    assert "untriaged" in out
    (fork.root / "upstream-triage.toml").write_text(
        TRIAGE_HEAD
        + f'[[triage]]\ncandidates = ["{f1_candidate()}", "aiter/{fix[:12]}"]\n'
        + 'not_relevant = "made up"\n'
    )
    assert main(["watch", "--aiter-repo", str(aiter)]) == 0
    assert "0 untriaged" in capsys.readouterr().out


def test_commits_after_the_newest_release_in_a_vllm_clone(fork, tmp_path):
    clone = tmp_path / "vllm"
    clone.mkdir()
    git(clone, "init", "-q", "-b", "main")
    (clone / "vllm").mkdir()
    (clone / "vllm/layer.py").write_text(RELEASES[V3]["vllm/layer.py"])
    git(clone, "add", "-A")
    git(clone, "commit", "-q", "-m", "release")
    git(clone, "tag", f"v{V3}")
    (clone / "vllm/layer.py").write_text(layer({1: "x + 101", 4: "x * 4", 3: "x - 3"}))
    git(clone, "commit", "-q", "-am", "Fix f1 (#123)")
    sha = git(clone, "rev-parse", "HEAD")
    report = watch(load_config(), vllm_repo=str(clone))
    (found,) = [c for c in report.candidates if c.id.startswith(f"vllm/{sha[:12]}")]
    assert found.id == f"vllm/{sha[:12]}/vllm/layer.py:f1"
    assert found.bases == (V1,) and "Fix f1 (#123)" in found.summary


def test_a_clone_without_the_release_tag_needs_since(fork, tmp_path, capsys):
    clone = tmp_path / "vllm"
    clone.mkdir()
    git(clone, "init", "-q", "-b", "main")
    (clone / "x").write_text("x\n")
    git(clone, "add", "-A")
    git(clone, "commit", "-q", "-m", "x")
    assert main(["watch", "--vllm-repo", str(clone)]) == 2
    assert "--vllm-since" in capsys.readouterr().err


# --- the pieces -----------------------------------------------------------------


def test_triage_file_errors_name_the_entry():
    with pytest.raises(ConfigError, match="exactly one of 'register' or 'not_relevant'"):
        parse_triage('[[triage]]\ncandidates = ["vllm/x"]\n', "t.toml", [])
    with pytest.raises(ConfigError, match="'nope' is not an entry of known-issues.toml"):
        parse_triage('[[triage]]\ncandidates = ["vllm/x"]\nregister = "nope"\n', "t.toml", ["a"])
    with pytest.raises(ConfigError, match="triaged twice"):
        parse_triage(
            '[[triage]]\ncandidates = ["aiter/1", "aiter/1"]\nnot_relevant = "x"\n', "t.toml", []
        )
    with pytest.raises(ConfigError, match="not a candidate id"):
        parse_triage('[[triage]]\ncandidates = ["x"]\nnot_relevant = "x"\n', "t.toml", [])


def test_units_of_a_python_file():
    text = (
        "import os\nX = 1\n\n\nclass A:\n    f: int = 1\n\n    def m(self):\n        return 1\n\n"
        "\n@dec\ndef h():\n    pass\n"
    )
    spans = unit_spans(text)
    assert unit_at(spans, 9) == "A.m" and unit_at(spans, 6) == "A"
    assert unit_at(spans, 12) == "h" and unit_at(spans, 2) == MODULE
    digests = unit_digests(text)
    # a method's change is not a change of its class's own statements
    other = unit_digests(text.replace("return 1", "return 2"))
    assert other["A.m"] != digests["A.m"] and other["A"] == digests["A"]
    assert unit_digests(text.replace("X = 1", "X = 1  # one"))[MODULE] == digests[MODULE]


def test_patch_units_map_hunks_to_functions():
    class Tree:
        def read_text(self, path):
            return layer() if path == "vllm/layer.py" else None

    patch = (
        "diff --git a/vllm/layer.py b/vllm/layer.py\n--- a/vllm/layer.py\n+++ b/vllm/layer.py\n"
        "@@ -9,2 +9,3 @@\n def f2(x):\n-    return x + 2\n+    return x + 22\n+    # more\n"
        "diff --git a/csrc/k.cu b/csrc/k.cu\nnew file mode 100644\n--- /dev/null\n+++ b/csrc/k.cu\n"
        "@@ -0,0 +1 @@\n+// ours\n"
    )
    units = patch_units(Tree(), patch)
    assert {str(u) for u in units} == {"vllm/layer.py:f2"}


def test_ranges():
    order = ["1", "2", "3", "4", "5"]
    assert format_ranges(["1", "2", "3", "5"], order) == "1-3, 5"
