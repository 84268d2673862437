"""What ruff lints: every module of the tool, the package ``vllm_fork.series``
included; only the top-level ``series/`` data directory is left out."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def linted_files() -> set[Path]:
    proc = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--show-files", "."],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    return {Path(line).resolve() for line in proc.stdout.splitlines() if line.strip()}


def test_ruff_lints_the_series_package_and_not_the_series_data() -> None:
    files = linted_files()
    package = sorted((REPO / "src" / "vllm_fork" / "series").glob("*.py"))
    assert package, "src/vllm_fork/series/ has no modules"
    missing = [str(p.relative_to(REPO)) for p in package if p.resolve() not in files]
    assert not missing, f"ruff does not lint {missing} (an exclude matches them)"
    data = (REPO / "series").resolve()
    assert not [f for f in files if data in f.parents], "ruff lints the series/ data directory"
