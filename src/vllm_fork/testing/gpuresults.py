"""The committed results of the GPU test bundles (``vllm-fork gpu-bundle``),
read for ``release-check``: ``bench/gpu/graph_hazards/results/<date>/<base>/``
holds ``summary.json`` (written by the bundle's ``run_bundle.py``) and
``env.txt``."""

from __future__ import annotations

import json
from pathlib import Path

from vllm_fork.config import find_root
from vllm_fork.errors import ForkError

RESULTS_DIR = "bench/gpu/graph_hazards/results"
FAILED = ("failed", "error")


def _device(env: Path) -> str:
    if env.is_file():
        for line in env.read_text().splitlines():
            if line.startswith("device "):
                return line.removeprefix("device ").strip()
    return "a GPU"


def _fails(result: str) -> bool:
    return result in FAILED or str(result).startswith("crashed")


def last_gpu_run(version: str, root: Path | None = None) -> str | None:
    """One line on the latest committed GPU run of ``version``, or None."""
    try:
        root = root or find_root()
    except ForkError:
        return None
    runs = sorted((root / RESULTS_DIR).glob(f"*/{version}/summary.json"))
    if not runs:
        return None
    latest = runs[-1]
    try:
        data = json.loads(latest.read_text())
    except (OSError, ValueError):
        return f"{version}: unreadable GPU results at {latest.relative_to(root)}"
    counts: dict[str, int] = {}
    for run in data.get("runs", []):
        if str(run.get("name", "")).startswith("without-"):
            continue
        for result, n in run.get("counts", {}).items():
            counts[result] = counts.get(result, 0) + int(n)
    proven = sum(
        1
        for row in data.get("tests", [])
        if row.get("with") == "passed"
        and any(
            v in FAILED or str(v).startswith("crashed") for v in row.get("without", {}).values()
        )
    )
    return (
        f"{version}: {latest.parent.parent.name} on {_device(latest.with_name('env.txt'))}: "
        f"{counts.get('passed', 0)} passed, {counts.get('failed', 0)} failed, "
        f"{counts.get('error', 0)} errors, {counts.get('skipped', 0)} skipped; "
        f"{proven} fail without their fork patch"
    )
