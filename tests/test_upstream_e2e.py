"""End to end with the real default base (downloaded once into the user cache)."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from vllm_fork.facts.names import tag_for
from vllm_fork.probes import GitTree
from vllm_fork.series import store
from vllm_fork.sources.pins import load_pins
from vllm_fork.sources.workspace import load_config
from vllm_fork.tree.materialize import materialize

REPO = Path(__file__).resolve().parents[1]
UPSTREAM_TOP = {"vllm", "csrc", "tests", "setup.py", "CMakeLists.txt", "requirements", "docker"}

pytestmark = [pytest.mark.network, pytest.mark.slow]


def test_bases_toml_pins_supported_bases() -> None:
    pins = load_pins(REPO / "bases.toml")
    assert pins.default == "0.21.0"
    supported = {v for v, b in pins.bases.items() if b.supported}
    assert supported >= {"0.19.1", "0.20.0", "0.21.0", "0.22.0", "0.33.0"}
    # a supported base is one the fork maintains: it has its own series
    for version in supported:
        assert store.has_series(REPO / "series", version), version
    for base in pins.bases.values():
        assert base.sdist.filename == f"vllm-{base.version}.tar.gz"
        assert base.wheel is not None and base.wheel.filename.endswith("_x86_64.whl")


def test_upstream_source_fixture(upstream_source: Callable[[str], GitTree]) -> None:
    tree = upstream_source("0.21.0")
    pkg_info = tree.read_text("PKG-INFO")
    assert pkg_info is not None and "Version: 0.21.0" in pkg_info
    assert tree.read_text("no/such/file.py") is None


def test_materialize_default_base(
    upstream_source: Callable[[str], GitTree], tmp_path: Path
) -> None:
    upstream_source("0.21.0")  # warm the cache through the fixture
    config = load_config(root=REPO)
    target = tmp_path / "vllm-0.21.0"
    result = materialize(config, None, target)
    assert result.version == "0.21.0"
    assert {p.name for p in target.iterdir()} >= UPSTREAM_TOP
    status = subprocess.run(
        ["git", "status", "--porcelain"], cwd=target, capture_output=True, text=True, check=True
    )
    assert status.stdout == ""
    log = subprocess.run(
        ["git", "log", "--format=%an", f"{tag_for(result.version)}..HEAD"],
        cwd=target,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\n")
    base = store.read_base(config.series_root, "0.21.0")
    expected = len(base.stems) if base else 0
    assert expected > 0
    assert len([ln for ln in log if ln]) == expected == result.applied
