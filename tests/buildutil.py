"""A synthetic base with an upstream wheel pin and a series, for build tests."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from vllm_fork.sources.pins import FilePin, load_pins, save_pins
from vllm_fork.tree.export import export
from vllm_fork.tree.materialize import materialize

from .conftest import FAKE_VERSION, ForkRepo
from .gitutil import commit, trailer_block

WHEEL_PIN = FilePin(f"vllm-{FAKE_VERSION}-1-cp38-abi3-manylinux_2_28_x86_64.whl", "ab" * 32)


def pin_wheel(repo: ForkRepo) -> None:
    pins = load_pins(repo.config.bases_file)
    pins.bases[FAKE_VERSION] = replace(pins.bases[FAKE_VERSION], wheel=WHEEL_PIN)
    save_pins(repo.config.bases_file, pins)


def python_patch(tree: Path) -> None:
    layer = (tree / "vllm/layer.py").read_text()
    commit(
        tree,
        "[ROCm] Change f3",
        "Make f3 add more.",
        trailer_block(change="ar-rms-pack-gate"),
        {"vllm/layer.py": layer.replace("return x + 3\n", "return x + 33\n")},
    )


def csrc_patch(tree: Path) -> None:
    commit(
        tree,
        "[Kernel] Read the cache in its own dtype",
        "Kernel change.",
        trailer_block(
            change="rope-cache-dtype",
            origin="backport, https://github.com/vllm-project/vllm/pull/41113",
        ),
        {"csrc/kernel.cu": "// kernel, changed\nint main() { return 1; }\n"},
    )


def make_series(repo: ForkRepo, tmp_path: Path, *steps) -> Path:
    """Materialize the base, commit ``steps`` (functions of the tree), export the series."""
    tree = tmp_path / "wt"
    materialize(repo.config, None, tree)
    for step in steps:
        step(tree)
    export(repo.config, tree)
    return tree
