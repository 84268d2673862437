"""The tool's release tests: the long checks of its own test suite.

Tests of ``tests/`` marked ``release`` (the end-to-end builds of the default
base, the ROCm and deploy end to end, the hostile-wheel fuzz, ...) are not
part of the test command (``scripts/test.sh``): they run only where
``VLLM_FORK_RELEASE_TESTS=1`` (tests/conftest.py skips them elsewhere, with
that reason). ``vllm-fork release-check`` runs them with the default base's
check (step ``tool-tests``), from the fork checkout, with the tool's Python.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Iterator
from pathlib import Path

from vllm_fork.errors import ForkError
from vllm_fork.hashing import sha256_bytes, sha256_file
from vllm_fork.testing.forktests import PytestOutcome, run_pytest

MARKER = "release"
ENV = "VLLM_FORK_RELEASE_TESTS"
# what a run of them also switches on: the real builds of the default base
ENV_ON = {ENV: "1", "VLLM_FORK_E2E_BUILD": "1"}
SUITE = "tests"
# the parts of the checkout whose change redoes a recorded run (with the series
# and the pins, which the default base's inputs hold already)
SOURCES = ("pyproject.toml", "src", SUITE, "sim", "docker", "scripts")
# two real builds and installs of the default base with a cold cache on 2 cores
TIMEOUT = 4 * 3600.0


class ToolTestsUnavailable(ForkError):
    """The release tests cannot run here (no test suite, no pytest)."""


def enabled(environ: dict[str, str] | None = None) -> bool:
    """Whether the release tests run in this process's test session."""
    return (os.environ if environ is None else environ).get(ENV) == "1"


def _files(root: Path) -> Iterator[Path]:
    for name in SOURCES:
        path = root / name
        if path.is_file():
            yield path
        elif path.is_dir():
            for file in sorted(path.rglob("*")):
                parts = file.relative_to(root).parts
                if file.is_file() and "__pycache__" not in parts and file.suffix != ".pyc":
                    yield file


def sources_digest(root: Path) -> str:
    """The digest of what the release tests run from: a recorded run of another
    digest is redone."""
    lines = [f"{f.relative_to(root).as_posix()} {sha256_file(f)}" for f in _files(root)]
    return sha256_bytes("\n".join(lines).encode())


def run_release_tests(root: Path, python: str | None = None) -> PytestOutcome:
    """``pytest -m release`` over the suite of the checkout ``root``, with the
    release tests and the real builds switched on; pytest's output goes to this
    process's output."""
    suite = root / SUITE
    if not (suite / "conftest.py").is_file():
        raise ToolTestsUnavailable(
            f"no test suite at {suite}: run release-check from a checkout of the fork"
        )
    python = python or sys.executable
    if python == sys.executable and importlib.util.find_spec("pytest") is None:
        raise ToolTestsUnavailable(
            "pytest is not installed with the tool: install it with its dev extras "
            "(python -m pip install '.[dev]')"
        )
    return run_pytest(
        root,
        python,
        [SUITE],
        extra_args=["-m", MARKER, "-rs"],
        env={**os.environ, **ENV_ON},
        timeout=TIMEOUT,
    )
