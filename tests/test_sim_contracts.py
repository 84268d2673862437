"""The ROCm simulation's fakes keep the real AITER / amdsmi contracts of every base.

Runs in the tool's venv: no network, no torch (the golden-output check runs
only where torch is installed; the simulation's own tests run it in every
vLLM tree).
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import pytest

from vllm_fork.cache import CacheLayout, default_cache_dir
from vllm_fork.facts.names import tag_for
from vllm_fork.probes.rocm_pins import aiter_pin, amdsmi_imports, dockerfile_args
from vllm_fork.sources.pins import load_pins
from vllm_fork.sourcetree import DirTree

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "sim"))

from vllm_rocm_sim import contracts  # noqa: E402

CONTRACTS = REPO / "sim" / "contracts"


def test_every_pinned_base_has_its_aiter_tag_recorded():
    bases = contracts.load("bases.json")
    versions = load_pins(REPO / "bases.toml").versions()
    missing = [v for v in versions if v not in bases]
    assert not missing, (
        f"bases {', '.join(missing)} are pinned but not in sim/contracts/bases.json; "
        "run scripts/aiter_contracts.py extract"
    )
    for version, pin in bases.items():
        assert re.fullmatch(r"v\d+\.\d+\.\d+\S*", pin["aiter"]), (version, pin)
        assert (CONTRACTS / "aiter" / f"{pin['contract']}.json").is_file(), version


def test_fakes_keep_the_contracts_of_every_pinned_tag():
    rows, failures = contracts.check_bases()
    assert not failures, "\n".join(failures)
    states = {r.state for r in rows}
    # Something was compared, and most of it matched exactly.
    assert contracts.MATCHED in states
    assert sum(r.state == contracts.MATCHED for r in rows) > len(rows) // 2


def _copy(tmp_path: Path) -> tuple[Path, Path]:
    site = tmp_path / "site"
    root = tmp_path / "contracts"
    shutil.copytree(contracts.SITE, site, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(CONTRACTS, root)
    return site, root


def test_a_changed_fake_signature_fails_naming_function_and_tag(tmp_path):
    site, root = _copy(tmp_path)
    fake = site / "aiter" / "__init__.py"
    text = fake.read_text()
    broken = text.replace(
        "def biased_grouped_topk(\n    gating_output", "def biased_grouped_topk(\n    logits", 1
    )
    assert broken != text
    fake.write_text(broken)
    _, failures = contracts.check_bases(root, site)
    hits = [f for f in failures if f.startswith("aiter.biased_grouped_topk at AITER v0.1.13:")]
    assert hits, "\n".join(failures)
    assert "fake (logits, " in hits[0] and "real (gating_output, " in hits[0]
    assert "0.21.0" in hits[0]


def test_an_amdsmi_name_vllm_imports_and_the_fake_lacks_fails(tmp_path):
    site, root = _copy(tmp_path)
    fake = site / "amdsmi" / "__init__.py"
    text = fake.read_text()
    fake.write_text(text.replace("def amdsmi_get_gpu_memory_total(", "def _gone(", 1))
    _, failures = contracts.check_bases(root, site)
    assert (
        "amdsmi.amdsmi_get_gpu_memory_total: vLLM 0.24.0 imports it; the fake amdsmi lacks it"
        in failures
    ), "\n".join(failures)


def test_a_base_whose_tag_has_no_contract_fails(tmp_path):
    site, root = _copy(tmp_path)
    bases = json.loads((root / "bases.json").read_text())
    bases["9.9.9"] = {"aiter": "v0.9.0", "contract": "v0.9.0", "amdsmi_imports": []}
    (root / "bases.json").write_text(json.dumps(bases))
    _, failures = contracts.check_bases(root, site)
    assert any(
        f.startswith("base 9.9.9 pins AITER v0.9.0: no contract sim/contracts/aiter/v0.9.0.json")
        for f in failures
    ), failures


def test_a_stale_deviation_fails(tmp_path):
    site, root = _copy(tmp_path)
    deviations = json.loads((root / "deviations.json").read_text())
    deviations["aiter.topk_sigmoid@*"] = "no longer true"
    (root / "deviations.json").write_text(json.dumps(deviations))
    _, failures = contracts.check_bases(root, site)
    assert any(f.startswith("aiter.topk_sigmoid@*: listed in deviations.json") for f in failures)


def test_compare_kinds():
    def sig(*params, returns=None):
        return {"params": list(params), "returns": returns}

    a = {"name": "a", "kind": "positional_or_keyword"}
    b1 = {"name": "b", "kind": "positional_or_keyword", "default": "1"}
    b2 = {"name": "b", "kind": "positional_or_keyword", "default": "2"}
    c = {"name": "c", "kind": "positional_or_keyword"}
    assert contracts.compare(sig(a, b1), sig(a, b1))[0] == contracts.MATCHED
    assert contracts.compare(sig(a, b1), sig(a))[0] == contracts.NEWER
    assert contracts.compare(sig(a, c), sig(a))[0] == contracts.MISMATCH  # extra has no default
    assert contracts.compare(sig(a, b1), sig(a, b2))[0] == contracts.MISMATCH
    assert contracts.compare(sig(a), sig(a, returns="None"))[0] == contracts.MISMATCH


def test_probe_reads_pin_and_amdsmi_names(tmp_path):
    (tmp_path / "docker").mkdir()
    (tmp_path / "docker" / "Dockerfile.rocm_base").write_text(
        "ARG BASE_IMAGE=rocm/dev:7 # comment\n"
        'ARG AITER_BRANCH="v0.1.13.post1"\n'
        "FROM ${BASE_IMAGE}\n"
        "ARG AITER_BRANCH\n"
    )
    pkg = tmp_path / "vllm" / "platforms"
    pkg.mkdir(parents=True)
    (pkg / "rocm.py").write_text(
        "try:\n    from amdsmi import (AmdSmiException,\n        amdsmi_init)\n"
        "except ImportError:\n    pass\n"
    )
    (pkg / "__init__.py").write_text(
        "def f():\n    import amdsmi\n    amdsmi.amdsmi_shut_down()\n# amdsmi\n"
    )
    tree = DirTree(tmp_path)
    assert aiter_pin(tree) == "v0.1.13.post1"
    assert dockerfile_args("ARG A=1\nARG A=2\n") == {"A": "1"}
    assert amdsmi_imports(tree) == {
        "AmdSmiException": ["vllm/platforms/rocm.py"],
        "amdsmi_init": ["vllm/platforms/rocm.py"],
        "amdsmi_shut_down": ["vllm/platforms/__init__.py"],
    }
    assert not (tmp_path / "Dockerfile").exists() and not Path("Dockerfile").exists()
    (tmp_path / "docker" / "Dockerfile.rocm_base").unlink()
    assert aiter_pin(tree) is None


def test_fake_reproduces_golden_outputs():
    torch = pytest.importorskip("torch")
    del torch
    sys.path.insert(0, str(contracts.SITE))
    try:
        import aiter
    finally:
        sys.path.remove(str(contracts.SITE))
    compared, failures = contracts.golden_mismatches(aiter)
    assert not failures, "\n".join(failures)
    assert compared >= 10


def test_recorded_pins_are_what_the_cached_trees_say():
    """bases.json is generated from the trees; where the tool's cache holds a
    base's upstream tag, the recorded pin and amdsmi names must still be its."""
    from vllm_fork.sourcetree import GitTree

    repo = CacheLayout(default_cache_dir()).upstream_git
    bases = contracts.load("bases.json")
    checked = 0
    for version, pin in bases.items():
        try:
            tree = GitTree(repo, tag_for(version))
        except ValueError:
            continue
        assert aiter_pin(tree) == pin["aiter"], version
        assert sorted(amdsmi_imports(tree)) == pin["amdsmi_imports"], version
        checked += 1
    if not checked:
        pytest.skip("no base's upstream tag in the download cache")
