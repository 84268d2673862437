"""The release tests (marker ``release``): skipped by the test command with the
reason naming `vllm-fork release-check`, which runs them (tests/test_release.py
runs its step tool-tests); the digest that redoes a recorded run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_fork.testing import toolsuite

REPO = Path(__file__).resolve().parents[1]
# the long checks the test command leaves to release-check
RELEASE_MODULES = (
    "tests/test_build_e2e.py",
    "tests/test_deploy_e2e.py",
    "tests/test_rocm_e2e.py",
    "tests/test_hostile_wheels.py",
)


def run_pytest(*args: str, release: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != toolsuite.ENV}
    if release is not None:
        env[toolsuite.ENV] = release
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
    )


def test_the_release_tests_are_skipped_with_the_reason_naming_release_check() -> None:
    proc = run_pytest("-rs", "-m", "release", *RELEASE_MODULES, release=None)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert " passed" not in proc.stdout and " failed" not in proc.stdout
    reasons = [line for line in proc.stdout.splitlines() if line.startswith("SKIPPED")]
    assert reasons and all("`vllm-fork release-check` runs it" in r for r in reasons), reasons
    # every module named has its release tests (none of them runs here)
    for module in RELEASE_MODULES:
        assert any(module in r for r in reasons), (module, reasons)


def test_only_the_release_tests_are_selected_by_the_marker() -> None:
    proc = run_pytest("--collect-only", "-m", "release", "tests", release="1")
    assert proc.returncode == 0, proc.stdout[-3000:]
    modules = {line.split("::")[0] for line in proc.stdout.splitlines() if "::" in line}
    assert modules == set(RELEASE_MODULES)


def test_the_digest_follows_the_tools_sources_and_not_its_byte_code(tmp_path: Path) -> None:
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_x.py").write_text("def test_x():\n    pass\n")
    (tmp_path / "bases.toml").write_text("")
    first = toolsuite.sources_digest(tmp_path)
    (tmp_path / "tests" / "__pycache__").mkdir()
    (tmp_path / "tests" / "__pycache__" / "test_x.cpython-312.pyc").write_bytes(b"\0")
    (tmp_path / "bases.toml").write_text("# the pins: in the base's own inputs\n")
    assert toolsuite.sources_digest(tmp_path) == first
    (tmp_path / "tests" / "test_x.py").write_text("def test_x():\n    assert False\n")
    assert toolsuite.sources_digest(tmp_path) != first


def test_without_a_suite_the_release_tests_cannot_run(tmp_path: Path) -> None:
    with pytest.raises(toolsuite.ToolTestsUnavailable, match="no test suite at "):
        toolsuite.run_release_tests(tmp_path)
