"""The known-issue register (known-issues.toml): reading it, the state rule, and a
made-up entry carried through status, matrix and release-check until a fix lands."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from vllm_fork.cli.main import main
from vllm_fork.errors import ConfigError
from vllm_fork.facts import known_issues as ki
from vllm_fork.facts import registry
from vllm_fork.release import check

from .gitutil import IDENTITY
from .rebase_support import DATE, Fork, git, make_fork

ROOT = Path(__file__).resolve().parents[1]


class Files:
    """A SourceTree from a dict."""

    def __init__(self, files: dict[str, str]) -> None:
        self.files = files

    def read_text(self, path: str) -> str | None:
        return self.files.get(path)


ENTRY = """
[[issue]]
id = "made-up-1"
title = "f3 adds the wrong constant"
tracker_refs = ["vllm#99999"]
change = "ar-rms-pack-gate"
impact = "every call of f3 is off by one"
decision = "fix"
reason = "a fork patch until upstream releases its fix"
upstream_fix = "9.9.9"
affected = { file = "vllm/layer.py", match = 'def f3\\(', why = "f3" }
fixed = { file = "vllm/layer.py", function = "f3", match = 'FIXED_F3', why = "the fix of f3" }
"""


def register(text: str = ENTRY) -> tuple[ki.KnownIssue, ...]:
    return ki.parse_register(text, "known-issues.toml", registry.change_ids())


# --- reading the register ------------------------------------------------------------


def test_the_repository_register_reads_and_names_real_changes() -> None:
    issues = ki.load_register(ROOT / "known-issues.toml", registry.change_ids())
    ids = [i.id for i in issues]
    assert len(ids) == len(set(ids))
    for issue in issues:
        assert issue.urls and all(u.startswith("https://github.com/") for u in issue.urls)


@pytest.mark.parametrize(
    "text, message",
    [
        ("[[issue]\n", "not valid TOML"),
        (ENTRY.replace('decision = "fix"', 'decision = "ignore"'), "is not one of fix, mitigate"),
        (ENTRY.replace("ar-rms-pack-gate", "no-such-change"), "unknown change 'no-such-change'"),
        (ENTRY.replace("vllm#99999", "#99999"), "not a tracker reference"),
        (ENTRY.replace("'def f3\\('", "'def f3('"), "bad regular expression"),
        (ENTRY.replace('why = "f3" ', 'colour = "red" '), "unknown key(s) colour"),
        (ENTRY + ENTRY, "listed twice"),
        (ENTRY.replace('decision = "fix"', 'decision = "mitigate"'), "needs a 'mitigated' probe"),
        ("[issues]\n", "unknown table(s) issues"),
    ],
)
def test_a_malformed_register_is_one_configuration_error(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match="known-issues.toml") as err:
        register(text)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_a_malformed_register_exits_3_with_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    fork = make_fork(tmp_path, monkeypatch, {"1.0.0": LAYER_FILES}, default="1.0.0")
    (fork.root / "known-issues.toml").write_text(ENTRY.replace("vllm#99999", "jira-7"))
    assert main(["status"]) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a tracker reference" in err[0]


# --- the state rule ------------------------------------------------------------------

LAYER = "".join(f"def f{i}(x):\n    return x + {i}\n\n\n" for i in range(6))
FIXED_LAYER = LAYER.replace("return x + 3", "return x + 3 - 1  # FIXED_F3")


@pytest.mark.parametrize(
    "pristine, patched, fixes, state",
    [
        ({}, {}, (), ki.NOT_AFFECTED),
        ({"vllm/layer.py": LAYER}, {"vllm/layer.py": LAYER}, (), ki.AFFECTED),
        ({"vllm/layer.py": LAYER}, {"vllm/layer.py": FIXED_LAYER}, ("0002-fix",), ki.FIXED_FORK),
        ({"vllm/layer.py": FIXED_LAYER}, {"vllm/layer.py": FIXED_LAYER}, (), ki.FIXED_UPSTREAM),
    ],
)
def test_state_of_an_entry(pristine, patched, fixes, state) -> None:
    (issue,) = register()
    got = ki.decide(issue, Files(pristine), Files(patched), fixes)
    assert got.state == state
    assert got.patches == tuple(fixes)
    assert "\n" not in got.reason


def test_a_fix_outside_the_named_function_does_not_count() -> None:
    (issue,) = register()
    elsewhere = LAYER.replace("return x + 4", "return x + 4  # FIXED_F3")
    got = ki.decide(issue, Files({"vllm/layer.py": LAYER}), Files({"vllm/layer.py": elsewhere}))
    assert got.state == ki.AFFECTED
    assert "vllm/layer.py:f3() lacks the fix of f3" in got.reason


def test_a_mitigation_counts_only_while_no_fix_is_in() -> None:
    text = (
        ENTRY.replace('decision = "fix"', 'decision = "mitigate"')
        + 'mitigated = { file = "vllm/layer.py", match = "SAFE_DEFAULT", why = "the default" }\n'
        + 'until = "AITER v9"\n'
    )
    (issue,) = register(text.replace("[[issue]]", "[[issue]]", 1))
    safe = LAYER + "SAFE_DEFAULT = True\n"
    got = ki.decide(issue, Files({"vllm/layer.py": LAYER}), Files({"vllm/layer.py": safe}))
    assert (got.state, got.reason) == (ki.MITIGATED, "vllm/layer.py: the default until AITER v9")
    assert ki.decide(issue, Files({}), Files({"vllm/layer.py": LAYER})).state == ki.AFFECTED


# --- a made-up entry through the commands ---------------------------------------------

V = "3.0.0"
LAYER_FILES = {"vllm/__init__.py": "", "vllm/layer.py": LAYER}


def _commit(work: Path, message: str) -> None:
    git(work, "add", "-A")
    env = {"GIT_AUTHOR_DATE": DATE, "GIT_COMMITTER_DATE": DATE, **IDENTITY}
    git(work, "commit", "-q", "-m", message, env=env)


def _message(subject: str, extra: str = "", part: str = "hardening") -> str:
    return (
        f"{subject}\n\nWhat it does.\n\nFork-Change: ar-rms-pack-gate\nFork-Part: {part}\n"
        f"Origin: vendor\nForwarded: no\n{extra}"
    )


def _author(fork: Fork, files: dict[str, str], message: str) -> None:
    """Add one patch writing ``files`` to series/V (materialize, commit, export)."""
    from vllm_fork.tree.export import export
    from vllm_fork.tree.materialize import materialize

    work = fork.tmp / f"author-{len(list(fork.tmp.glob('author-*')))}"
    materialize(fork.config, V, work)
    for rel, content in files.items():
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        (work / rel).write_text(content)
    _commit(work, message)
    export(fork.config, work)


@pytest.fixture
def made_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Fork:
    """Base V with a one-patch series and a register whose one entry it is affected by."""
    fork = make_fork(tmp_path, monkeypatch, {V: LAYER_FILES}, default=V)
    _author(
        fork,
        {
            "tests/test_layer.py": "from vllm.layer import f1\n\n\ndef test_f1():\n"
            "    assert f1(1) == 2\n"
        },
        _message("[Tests] Pin f1", part="tests"),
    )
    (fork.root / "known-issues.toml").write_text(ENTRY.replace('upstream_fix = "9.9.9"\n', ""))
    monkeypatch.setattr(
        "vllm_fork.testing.treevenv.ensure_tree_venv", lambda *a, **k: Path(sys.executable)
    )
    monkeypatch.setattr(check, "pytest_args", lambda tree: [])
    return fork


def _fix(fork: Fork) -> None:
    _author(
        fork,
        {
            "vllm/layer.py": FIXED_LAYER,
            "tests/test_layer_f3.py": "from vllm.layer import f3\n\n\ndef test_f3():\n"
            "    assert f3(1) == 3\n",
        },
        _message("[Bugfix] Fix f3", "Fork-Fixes: made-up-1\n"),
    )


def test_a_made_up_entry_shows_in_status_matrix_and_release_check_until_fixed(
    made_up: Fork, tmp_path: Path, capsys
) -> None:
    # status: AFFECTED, with the probes' reason
    assert main(["status", "--base", V]) == 0
    out = capsys.readouterr().out
    assert "known issues (known-issues.toml):" in out
    assert "made-up-1" in out and "AFFECTED" in out and "vllm/layer.py:f3() lacks" in out

    # matrix --json: the same cell
    matrix_json = tmp_path / "m.json"
    main(["matrix", "--json", str(matrix_json)])
    data = json.loads(matrix_json.read_text())
    assert data["known_issues"][V]["made-up-1"]["state"] == ki.AFFECTED
    assert "| made-up-1 | AFFECTED |" in capsys.readouterr().out

    # release-check fails the base at its known-issues step
    report = check.release_check(made_up.config, [V], wheel=False)
    row = report.to_json()["bases"][0]
    assert row["result"] == "failed"
    assert row["known_issues"] == {"made-up-1": ki.AFFECTED}
    assert any("known-issues: AFFECTED by known issue(s): made-up-1" in r for r in row["reasons"])
    assert f"| {V} | AFFECTED: made-up-1 |" in check.format_report(report)

    # a fix patch naming the entry lands: fixed by fork, and the check passes
    _fix(made_up)
    assert main(["status", "--base", V]) == 0
    out = capsys.readouterr().out
    assert "fixed by fork" in out and "<- 0002-Bugfix-Fix-f3.patch" in out
    report = check.release_check(made_up.config, [V], wheel=False)
    row = report.to_json()["bases"][0]
    assert row["known_issues"] == {"made-up-1": ki.FIXED_FORK}
    assert row["result"] == "ok", row["reasons"]
    assert f"| {V} | none affected (1) |" in check.format_report(report)


def test_a_changed_register_checks_the_base_again(made_up: Fork) -> None:
    check.release_check(made_up.config, [V], wheel=False)
    path = made_up.root / "known-issues.toml"
    path.write_text(path.read_text().replace("def f3", "def f9"))
    report = check.release_check(made_up.config, [V], wheel=False)
    assert report.reused == set()
    assert report.to_json()["bases"][0]["known_issues"] == {"made-up-1": ki.NOT_AFFECTED}


def test_a_fix_naming_no_entry_is_refused(made_up: Fork, capsys) -> None:
    _author(made_up, {"vllm/other.py": "x = 1\n"}, _message("[Misc] x", "Fork-Fixes: typo-1\n"))
    assert main(["status", "--base", V]) == 1
    err = capsys.readouterr().err
    assert "Fork-Fixes names 'typo-1', which known-issues.toml does not list" in err
