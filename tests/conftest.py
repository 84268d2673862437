"""Shared fixtures.

TEMPORARY: ``upstream_source`` reads the unpacked upstream sdists under
/tmp/vllm-src until the tool's own download cache provides it (it will be
replaced by a fixture that downloads and verifies the sdist).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from vllm_fork.probes import DirTree, SourceTree

_UNPACKED = Path("/tmp/vllm-src")


@pytest.fixture
def upstream_source() -> Callable[[str], SourceTree]:
    def get(version: str) -> SourceTree:
        root = _UNPACKED / f"vllm-{version}"
        if not (root / "vllm").is_dir():
            pytest.skip(f"upstream vLLM {version} sources not available")
        return DirTree(root)

    return get
