"""A real rebase 0.21.0 -> 0.22.0 of a small series written by the test.

Needs the pinned sdists (index or a warm download cache): marked network and
slow. It prints the wall time of each step.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from vllm_fork.rebase.engine import RebaseConflict, continue_rebase, start_rebase
from vllm_fork.sources.workspace import load_config
from vllm_fork.tree.export import export
from vllm_fork.tree.materialize import materialize

try:
    from .rebase_support import DATE, git
except ImportError:
    from rebase_support import DATE, git  # type: ignore[no-redef]

pytestmark = [pytest.mark.network, pytest.mark.slow]

OLD, NEW = "0.21.0", "0.22.0"
REPO_ROOT = Path(__file__).resolve().parents[1]
KERNEL = "csrc/pos_encoding_kernels.cu"
MOVED_KERNEL = "csrc/libtorch_stable/pos_encoding_kernels.cu"
AITER = "vllm/_aiter_ops.py"
ROPE = "vllm/model_executor/layers/rotary_embedding/base.py"


def insert_after(path: Path, anchor: str, new: str) -> None:
    lines = path.read_text().splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if anchor in line)
    lines.insert(at + 1, new + "\n")
    path.write_text("".join(lines))


def replace_line(path: Path, anchor: str, new: str) -> None:
    lines = path.read_text().splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if anchor in line)
    indent = lines[at][: len(lines[at]) - len(lines[at].lstrip())]
    lines[at] = indent + new + "\n"
    path.write_text("".join(lines))


def commit(tree: Path, subject: str, change: str, part: str) -> None:
    origin = (
        "vendor" if part != "change" else "backport, https://github.com/vllm-project/vllm/pull/1"
    )
    message = (
        f"{subject}\n\nA test patch.\n\nFork-Change: {change}\nFork-Part: {part}\n"
        f"Origin: {origin}\nForwarded: no\n"
    )
    git(tree, "add", "-A")
    git(
        tree,
        "commit",
        "-q",
        "-m",
        message,
        env={"GIT_AUTHOR_DATE": DATE, "GIT_COMMITTER_DATE": DATE},
    )


def test_rebase_0_21_0_onto_0_22_0(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "repo"
    (root / "series").mkdir(parents=True)
    shutil.copyfile(REPO_ROOT / "bases.toml", root / "bases.toml")
    monkeypatch.setenv("VLLM_FORK_ROOT", str(root))
    config = load_config()
    times: dict[str, float] = {}

    start = time.monotonic()
    author = tmp_path / "author"
    materialize(config, OLD, author)
    times["materialize 0.21.0 (empty series)"] = time.monotonic() - start

    insert_after(author / KERNEL, "namespace vllm {", "// fork test: cache dtype is bounded")
    commit(author, "[ROCm] Mark the rotary kernel", "rope-cache-dtype", "hardening")
    replace_line(
        author / AITER,
        "hidden_ok = hidden_dim in (512, 1024, 2048, 4096, 7168)",
        "hidden_ok = hidden_dim % 8 == 0 and hidden_dim // 8 <= 1024",
    )
    commit(
        author, "[ROCm][AITER] Gate fused AR+RMSNorm on the pack size", "ar-rms-pack-gate", "change"
    )
    insert_after(
        author / ROPE,
        "def _match_cos_sin_cache_dtype(",
        "        # fork test: a bf16 copy of the cache may be used here",
    )
    commit(author, "[ROCm] Note the bf16 cache copy", "rope-bf16-buffer", "change")
    (author / "tests/rocm_fork").mkdir(parents=True)
    (author / "tests/rocm_fork/test_marker.py").write_text("def test_marker():\n    pass\n")
    commit(author, "[ROCm] Add a fork test", "ar-rms-pack-gate", "tests")
    export(config, author)

    tree = tmp_path / "tree"
    start = time.monotonic()
    materialize(config, OLD, tree)
    times["materialize 0.21.0 + 4 patches"] = time.monotonic() - start

    start = time.monotonic()
    try:
        result = start_rebase(config, OLD, NEW, tree, log=lambda _: None)
        resolved_by_hand = False
    except RebaseConflict as exc:
        # Only the gate patch may conflict (when the probes do not recognise 0.22.0's
        # gate): upstream rewrote that line. Skipping it drops the patch as absorbed.
        times["rebase until the conflict"] = time.monotonic() - start
        assert AITER in str(exc) and "Gate fused AR+RMSNorm" in str(exc)
        start = time.monotonic()
        result = continue_rebase(config, tree, skip=True, log=lambda _: None)
        resolved_by_hand = True
    times["rebase 0.21.0 -> 0.22.0" + (" (after the conflict)" if resolved_by_hand else "")] = (
        time.monotonic() - start
    )

    picks = {p.subject: p for p in result.state.picks}
    kernel = picks["[ROCm] Mark the rotary kernel"]
    assert kernel.result == "applied" and MOVED_KERNEL in kernel.detail
    assert "// fork test: cache dtype is bounded" in (tree / MOVED_KERNEL).read_text()
    assert picks["[ROCm][AITER] Gate fused AR+RMSNorm on the pack size"].result == "absorbed"
    assert picks["[ROCm] Note the bf16 cache copy"].result == "applied"
    assert picks["[ROCm] Add a fork test"].result == "applied"
    assert git(tree, "rev-parse", "upstream/0.22.0^") == git(tree, "rev-parse", "upstream/0.21.0")

    start = time.monotonic()
    again = tmp_path / "again"
    materialize(config, NEW, again)
    times["materialize 0.22.0 + exported series"] = time.monotonic() - start
    assert git(again, "rev-parse", "HEAD^{tree}") == git(tree, "rev-parse", "HEAD^{tree}")

    with capsys.disabled():
        print()
        for step, seconds in times.items():
            print(f"  {step}: {seconds:.1f} s")
