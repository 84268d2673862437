"""A synthetic base with an upstream wheel pin and a series, for build tests."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

from vllm_fork.facts.names import tag_for
from vllm_fork.sources.fetch import Fetcher
from vllm_fork.sources.pins import FilePin, load_pins, save_pins
from vllm_fork.tree.export import export
from vllm_fork.tree.materialize import materialize
from vllm_fork.wheel.provenance import PACKAGE_PATH, dumps

from .conftest import FAKE_FILES, FAKE_VERSION, ForkRepo
from .gitutil import commit, git, trailer_block
from .wheelutil import version_py, write_wheel

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


FULL_PATCH = "0002-Kernel-Vectorize-the-kernel.patch"


def full_csrc_patch(tree: Path, python: str | None = None) -> None:
    """A vendor kernel patch marked ``Fork-Build: full`` (with its test; ``python``: the
    new text of vllm/extra.py, a Python part too)."""
    edits = {
        "csrc/fast.cu": "// vectorized kernel\nint fast() { return 2; }\n",
        "tests/kernels/test_fast.py": "def test_fast():\n    assert True\n",
    }
    if python is not None:
        edits["vllm/extra.py"] = python
    commit(
        tree,
        "[Kernel] Vectorize the kernel",
        "Kernel change only a full build can carry.",
        trailer_block(change="rope-fast-kernel", origin="vendor", Fork_Build="full"),
        edits,
    )


def make_series(repo: ForkRepo, tmp_path: Path, *steps) -> Path:
    """Materialize the base, commit ``steps`` (functions of the tree), export the series."""
    tree = tmp_path / "wt"
    materialize(repo.config, None, tree)
    for step in steps:
        step(tree)
    export(repo.config, tree)
    return tree


UPSTREAM_TAG = "cp38-abi3-manylinux_2_28_x86_64"
UPSTREAM_SO = b"\x7fELF the upstream binary\n"


def upstream_wheel_files(overrides: dict[str, bytes] | None = None) -> dict[str, bytes]:
    """What upstream's wheel of the synthetic base holds: its sdist's package + a binary."""
    files = {rel: text.encode() for rel, text in FAKE_FILES.items() if rel.startswith("vllm/")}
    files["vllm/_version.py"] = version_py(FAKE_VERSION)
    files["vllm/_C.abi3.so"] = UPSTREAM_SO
    files.update(overrides or {})
    return files


def pin_upstream_wheel(
    repo: ForkRepo, directory: Path, overrides: dict[str, bytes] | None = None
) -> FilePin:
    """Write upstream's wheel of the base, put it in the download cache and pin it."""
    directory.mkdir(parents=True, exist_ok=True)
    path = write_wheel(
        directory / f"vllm-{FAKE_VERSION}-1-{UPSTREAM_TAG}.whl",
        upstream_wheel_files(overrides),
        FAKE_VERSION,
        UPSTREAM_TAG,
    )
    pin = FilePin(path.name, hashlib.sha256(path.read_bytes()).hexdigest())
    cached = Fetcher(repo.config).cached_path(pin)
    cached.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(path, cached)
    pins = load_pins(repo.config.bases_file)
    pins.bases[FAKE_VERSION] = replace(pins.bases[FAKE_VERSION], wheel=pin)
    save_pins(repo.config.bases_file, pins)
    return pin


def fork_wheel(
    directory: Path,
    record: dict,
    tree: Path,
    version: str,
    overrides: dict[str, bytes | None] | None = None,
) -> Path:
    """A fork wheel as a precompiled build makes it: upstream's wheel, the series'
    files from ``tree`` (its ``fork`` branch), the version and the provenance record;
    ``overrides``: member -> bytes, or None to leave the member out."""
    files = upstream_wheel_files()
    changed = git(tree, "diff", "--name-only", tag_for(FAKE_VERSION), "fork").split()
    for rel in changed:
        if rel.startswith("vllm/"):
            files[rel] = subprocess.run(
                ["git", "show", f"fork:{rel}"], cwd=tree, check=True, capture_output=True
            ).stdout
    files["vllm/_version.py"] = version_py(version)
    files[PACKAGE_PATH] = dumps(record).encode()
    for rel, data in (overrides or {}).items():
        if data is None:
            files.pop(rel, None)
        else:
            files[rel] = data
    directory.mkdir(parents=True, exist_ok=True)
    return write_wheel(
        directory / f"vllm-{version}-{UPSTREAM_TAG}.whl", files, version, UPSTREAM_TAG
    )
