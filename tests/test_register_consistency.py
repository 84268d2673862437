"""The register agrees with itself: a declared upstream_fix is checked against the
probes on the pinned releases, and "fixed upstream" comes from the probes."""

from __future__ import annotations

import pytest

from vllm_fork.cli.main import main
from vllm_fork.errors import ConfigError
from vllm_fork.reports.drift import compute_drift
from vllm_fork.reports.register import check_upstream_fix, issue_rows, pristine_fixed
from vllm_fork.sources.workspace import load_config

from .rebase_support import PatchSpec, make_fork

V1, V2, V3 = "1.0.0", "1.1.0", "1.2.0"
BUGGY = "def f3(x):\n    return x + 4\n"
FIXED = "def f3(x):\n    return x + 3  # FIXED_F3\n"
RELEASES = {
    V1: {"vllm/layer.py": BUGGY},
    V2: {"vllm/layer.py": BUGGY},
    V3: {"vllm/layer.py": FIXED},
}


def entry(upstream_fix: str) -> str:
    return f"""
[[issue]]
id = "made-up-f3"
title = "f3 adds the wrong constant"
tracker_refs = ["vllm#99999"]
change = "ar-rms-pack-gate"
impact = "every call of f3 is off by one"
decision = "fix"
reason = "a fork patch until upstream releases its fix"
upstream_fix = "{upstream_fix}"
affected = {{ file = "vllm/layer.py", match = 'def f3\\(', why = "f3" }}
fixed = {{ file = "vllm/layer.py", function = "f3", match = 'FIXED_F3', why = "the fix of f3" }}
"""


FIX = PatchSpec(
    "[ROCm] Fix f3",
    "ar-rms-pack-gate",
    "fix",
    {"vllm/layer.py": {2: "    return x + 3  # FIXED_F3"}},
    "Fork-Fixes: made-up-f3\n",
)


@pytest.fixture
def fork(tmp_path, monkeypatch):
    fork = make_fork(tmp_path, monkeypatch, RELEASES, default=V1)
    return fork


def test_a_declared_fix_release_the_probes_contradict_is_a_config_error(fork, capsys):
    (fork.root / "known-issues.toml").write_text(entry(V2))  # upstream fixed it in 1.2.0
    with pytest.raises(
        ConfigError, match=r"made-up-f3: upstream_fix = \"1.1.0\", but upstream 1.1.0 lacks"
    ):
        check_upstream_fix(load_config())
    assert main(["known-issues", "made-up-f3"]) == 3
    assert "made-up-f3" in capsys.readouterr().err
    assert main(["status", "--drift"]) == 3
    # the right release passes, and the state of the entry on every base is one command
    (fork.root / "known-issues.toml").write_text(entry(V3))
    check_upstream_fix(load_config())
    rows, missing = issue_rows(load_config(), ["made-up-f3"])
    assert missing == []
    assert {v: s.state for v, s in rows[0].states.items()} == {
        V1: "AFFECTED",
        V2: "AFFECTED",
        V3: "fixed upstream",
    }


def test_fixed_upstream_comes_from_the_probes(fork):
    (fork.root / "known-issues.toml").write_text(entry(V3))
    config = load_config()
    assert [pristine_fixed(config, v) for v in (V1, V2, V3)] == [
        frozenset(),
        frozenset(),
        frozenset({"made-up-f3"}),
    ]
    fork.write_series(V1, [FIX])
    # the fix patch is carried on 1.0.0, absent on 1.2.0: upstream has the fix
    # there, as the probes (not the declared release) say
    table = compute_drift(load_config(), [V1, V3])
    (row,) = table.rows
    assert row.cells[V3].state == "upstream"
    assert "known-issue probes of upstream 1.2.0" in row.cells[V3].detail
