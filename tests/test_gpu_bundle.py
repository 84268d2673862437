"""The GPU test bundle's pieces that run on CPU: which patches the GPU tests
name, and the reader of committed GPU results that release-check prints."""

from __future__ import annotations

import json
from pathlib import Path

from vllm_fork.series.patches import load_series
from vllm_fork.testing.gpubundle import GPU_DIR, guarded_patches, kernel_abi, kernel_files
from vllm_fork.testing.gpuresults import RESULTS_DIR, last_gpu_run

ROOT = Path(__file__).resolve().parent.parent


def test_every_gpu_test_names_patches_of_the_default_series():
    # The patches' headers, whitespace folded (subjects wrap).
    headers = " ".join(
        " ".join(p.read_text()[:600].split())
        for p in load_series(ROOT / "series" / "0.21.0", validate=False).patches
    )
    tests = sorted((ROOT / GPU_DIR / "tests").glob("test_gpu_*.py"))
    assert tests
    for test in tests:
        names = guarded_patches(test)
        assert names, f"{test.name} names no patch in FORK_PATCHES"
        assert any(name in headers for name in names), test.name


def test_guarded_patches_parses_the_tuple(tmp_path):
    test = tmp_path / "test_x.py"
    test.write_text('FORK_PATCHES = (\n    "First patch",\n    "Second, with a comma",\n)\n')
    assert guarded_patches(test) == ("First patch", "Second, with a comma")
    test.write_text("import torch\n")
    assert guarded_patches(test) == ()


def _write_run(root: Path, date: str, version: str, fork_passed: int) -> None:
    where = root / RESULTS_DIR / date / version
    where.mkdir(parents=True)
    (where / "env.txt").write_text("python 3.12.3\ndevice NVIDIA H100 80GB HBM3\n")
    summary = {
        "runs": [
            {"name": "fork-sim", "counts": {"passed": fork_passed, "skipped": 1}},
            {"name": "without-01-sim", "counts": {"failed": 2}},
        ],
        "tests": [
            {"test": "a::t1", "with": "passed", "without": {"P": "failed"}},
            {"test": "a::t2", "with": "passed", "without": {"P": "passed"}},
            {"test": "b::t3", "with": "passed", "without": {"Q": "crashed (signal 8)"}},
            {"test": "b::t4", "with": "failed", "without": {"Q": "failed"}},
        ],
    }
    (where / "summary.json").write_text(json.dumps(summary))


def test_last_gpu_run_reads_the_latest(tmp_path):
    (tmp_path / "bases.toml").write_text("")
    _write_run(tmp_path, "2026-11-20", "0.21.0", 3)
    _write_run(tmp_path, "2026-11-27", "0.21.0", 5)
    line = last_gpu_run("0.21.0", tmp_path)
    assert line == (
        "0.21.0: 2026-11-27 on NVIDIA H100 80GB HBM3: 5 passed, 0 failed, 0 errors, "
        "1 skipped; 2 fail without their fork patch"
    )
    assert last_gpu_run("0.20.1", tmp_path) is None


def test_bundle_refuses_a_directory_in_use(tmp_path, capsys):
    from vllm_fork.cli.main import main

    out = tmp_path / "bundle"
    out.mkdir()
    (out / "mine.txt").write_text("kept")
    assert main(["gpu-bundle", "--tree", str(tmp_path), "-o", str(out)]) == 2
    assert "exists and is not empty" in capsys.readouterr().err
    assert (out / "mine.txt").read_text() == "kept"


def _kernel_tree(root: Path, kernel: str, headers: dict[str, str]) -> Path:
    for rel, text in {"csrc/pos_encoding_kernels.cu": kernel, **headers}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_kernel_files_follow_local_includes(tmp_path):
    tree = _kernel_tree(
        tmp_path,
        '#include "torch_utils.h"\n#include <cuda_runtime.h>\n#include "core/cuda_compat.h"\n'
        "void f(torch::stable::Tensor& t);\n",
        {
            "csrc/torch_utils.h": '#include "dispatch_utils.h"\n',
            "csrc/dispatch_utils.h": "#pragma once\n",
            "csrc/core/cuda_compat.h": '#include "../missing.h"\n',
            "csrc/unrelated.h": "",
        },
    )
    assert kernel_files(tree) == [
        "csrc/core/cuda_compat.h",
        "csrc/dispatch_utils.h",
        "csrc/pos_encoding_kernels.cu",
        "csrc/torch_utils.h",
    ]
    assert kernel_abi(tree) == "stable"


def test_kernel_abi_of_a_torch_tensor_kernel_and_of_none(tmp_path):
    tree = _kernel_tree(tmp_path / "a", "void f(torch::Tensor& t);\n", {})
    assert kernel_abi(tree) == "torch"
    assert kernel_files(tree) == ["csrc/pos_encoding_kernels.cu"]
    assert kernel_abi(tmp_path) is None
    assert kernel_files(tmp_path) == []
