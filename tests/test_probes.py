"""Tests of the change probes: on real upstream trees and on small synthetic ones."""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

import pytest

from vllm_fork.facts import registry
from vllm_fork.probes import (
    DirTree,
    Finding,
    GitTree,
    probe,
    probe_all,
)

# --------------------------------------------------------------------------- helpers


def make_tree(root: Path, files: dict[str, str]) -> DirTree:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return DirTree(root)


# --------------------------------------------------------------------------- upstream trees

P, A, N = "present", "absent", "n/a"
# What each pristine release has, as the probes must find it. Written out here
# and compared with the registry's declared releases (upstream_since,
# applies_since), so that a wrong declaration and a wrong probe both fail.
EXPECTED = {
    #      rope-cache-dtype, rope-fast-kernel, rope-bf16-buffer, moe-bias-precast, dsv32, ar-rms
    "0.19.1": (N, N, A, A, A, N),
    "0.20.0": (A, A, A, P, A, N),
    "0.20.1": (A, A, A, P, A, N),
    "0.20.2": (A, A, A, P, A, N),
    "0.21.0": (P, A, A, P, A, A),
    "0.22.0": (P, A, A, P, A, P),
    "0.22.1": (P, A, A, P, A, P),
    "0.23.0": (P, A, P, P, P, P),
    "0.24.0": (P, A, P, P, P, P),
    "0.25.0": (P, A, P, P, P, P),
    "0.25.1": (P, A, P, P, P, P),
    "0.26.0": (P, A, P, P, P, P),
    "0.33.0": (P, A, P, P, P, P),
}


@pytest.mark.parametrize("version", sorted(EXPECTED))
def test_registry_declares_the_upstream_states(version):
    declared = tuple(c.expected_upstream(version) for c in registry.changes())
    assert declared == EXPECTED[version]


@pytest.mark.network
@pytest.mark.parametrize("version", sorted(EXPECTED))
def test_upstream_states(upstream_source, version):
    found = probe_all(upstream_source(version))
    assert list(found) == list(registry.change_ids())
    states = tuple(found[c].state for c in registry.change_ids())
    assert states == EXPECTED[version], {c: (f.state, f.reason) for c, f in found.items()}
    for cid, f in found.items():
        assert f.reason and "\n" not in f.reason
        ids = registry.get(cid).hardening_ids
        assert tuple(f.hardening) == tuple(i for i in ids if i not in f.hardening_na)


@pytest.mark.network
@pytest.mark.parametrize("change", registry.changes(), ids=lambda c: c.id)
def test_registry_files_exist_upstream(upstream_source, change):
    """Every file the registry names for a release is in that release's tree,
    except those the fork adds."""
    for version in EXPECTED:
        tree = upstream_source(version)
        for landing in change.files:
            if landing.at(version) and not landing.added:
                assert tree.read_text(landing.path) is not None, (version, landing.path)


@pytest.mark.network
def test_upstream_na_reasons(upstream_source):
    old = probe_all(upstream_source("0.19.1"))
    assert "query dtype" in old["rope-cache-dtype"].reason
    assert "_rocm_aiter_fused_allreduce_rmsnorm_impl" in old["ar-rms-pack-gate"].reason
    assert probe("ar-rms-pack-gate", upstream_source("0.20.0")).state == N
    assert "float32" in probe("rope-cache-dtype", upstream_source("0.20.0")).reason
    # the metadata cache has nothing to modify before 0.21.0
    assert "get_mla_metadata_v1" in old["dsv32-decode"].reason


@pytest.mark.network
@pytest.mark.parametrize("version", sorted(EXPECTED))
def test_upstream_lacks_our_hardening(upstream_source, version):
    found = probe_all(upstream_source(version))
    on = {(c, h) for c, f in found.items() for h, v in f.hardening.items() if v}
    # 0.26.0 widened the metadata key to per-request query and context lengths
    wide_key = version in ("0.26.0", "0.33.0")
    allowed = {("dsv32-decode", "complete-metadata-key")} if wide_key else set()
    assert on == allowed


# --------------------------------------------------------------------------- interface


def test_unknown_change_id(tmp_path):
    with pytest.raises(ValueError, match="unknown change id"):
        probe("no-such-change", DirTree(tmp_path))


def test_empty_tree_is_not_present(tmp_path):
    found = probe_all(DirTree(tmp_path))
    assert all(f.state == N for f in found.values())
    assert all(f.reason for f in found.values())


def test_finding_validates():
    with pytest.raises(ValueError):
        Finding("maybe", "x", {})
    with pytest.raises(ValueError):
        Finding(P, "two\nlines", {})


def test_dirtree_missing_and_escape(tmp_path):
    tree = make_tree(tmp_path, {"a/b.py": "x = 1\n"})
    assert tree.read_text("a/b.py") == "x = 1\n"
    assert tree.read_text("a/c.py") is None
    assert tree.read_text("a") is None
    with pytest.raises(ValueError):
        tree.read_text("../etc/passwd")


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True
    ).stdout.strip()


def test_gittree(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    _git(repo, "config", "user.email", "t@example.invalid")
    _git(repo, "config", "user.name", "t")
    (repo / "vllm").mkdir()
    (repo / "vllm" / "x.py").write_text("one\n")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "one")
    first = _git(repo, "rev-parse", "HEAD")
    _git(repo, "tag", "v1")
    (repo / "vllm" / "x.py").write_text("two\n")
    _git(repo, "commit", "-q", "-am", "two")

    old, new = GitTree(repo, "v1"), GitTree(repo, "HEAD")
    assert old.read_text("vllm/x.py") == "one\n"
    assert GitTree(repo, first).read_text("./vllm/x.py") == "one\n"
    assert new.read_text("vllm/x.py") == "two\n"
    assert new.read_text("vllm/missing.py") is None
    assert new.read_text("vllm") is None  # a directory is not a file
    # reads are cached: the worktree changing under it does not matter
    (repo / "vllm" / "x.py").write_text("three\n")
    _git(repo, "commit", "-q", "-am", "three")
    assert new.read_text("vllm/x.py") == "two\n"
    with pytest.raises(ValueError):
        GitTree(repo, "no-such-rev")


def test_gittree_probes_like_dirtree(tmp_path):
    repo = tmp_path / "repo"
    make_tree(repo, {"vllm/_aiter_ops.py": AR_WHITELIST, "vllm/__init__.py": ""})
    _git(repo, "init", "-q")
    _git(repo, "-c", "user.email=t@e.invalid", "-c", "user.name=t", "add", "-A")
    _git(repo, "-c", "user.email=t@e.invalid", "-c", "user.name=t", "commit", "-qm", "x")
    assert probe("ar-rms-pack-gate", GitTree(repo, "HEAD")) == probe(
        "ar-rms-pack-gate", DirTree(repo)
    )


# --------------------------------------------------------------------------- rope-cache-dtype

KERNEL_HEAD = "csrc/pos_encoding_kernels.cu"

ROPE_SAME_TYPE = """\
#include "dispatch_utils.h"
namespace vllm {
template <typename scalar_t, bool IS_NEOX>
__global__ void rotary_embedding_kernel(
    const int64_t* __restrict__ positions, scalar_t* __restrict__ query,
    scalar_t* __restrict__ key, const scalar_t* __restrict__ cos_sin_cache,
    const int rot_dim) {
  const scalar_t* row = cos_sin_cache + positions[blockIdx.x] * rot_dim;
}
}  // namespace vllm

void rotary_embedding(torch::Tensor& positions, torch::Tensor& query,
                      std::optional<torch::Tensor> key, int64_t head_size,
                      torch::Tensor& cos_sin_cache, bool is_neox) {
  int rot_dim = cos_sin_cache.size(1);
  VLLM_DISPATCH_FLOATING_TYPES(query.scalar_type(), "rotary_embedding", [&] {
    vllm::rotary_embedding_kernel<scalar_t, true><<<1, 1>>>(
        positions.data_ptr<int64_t>(), query.data_ptr<scalar_t>(), nullptr,
        cos_sin_cache.data_ptr<scalar_t>(), rot_dim);
  });
}
"""

ROPE_FP32_COPY = """\
namespace vllm {
template <typename scalar_t, bool IS_NEOX>
__global__ void rotary_embedding_kernel(
    const int64_t* __restrict__ positions, scalar_t* __restrict__ query,
    scalar_t* __restrict__ key, const float* __restrict__ cos_sin_cache,
    const int rot_dim) {}
}  // namespace vllm

void rotary_embedding(torch::Tensor& positions, torch::Tensor& query,
                      std::optional<torch::Tensor> key, int64_t head_size,
                      torch::Tensor& cos_sin_cache, bool is_neox) {
  auto cache_f32 = cos_sin_cache.to(torch::kFloat32);
  VLLM_DISPATCH_FLOATING_TYPES(query.scalar_type(), "rotary_embedding", [&] {
    vllm::rotary_embedding_kernel<scalar_t, true><<<1, 1>>>(
        positions.data_ptr<int64_t>(), query.data_ptr<scalar_t>(), nullptr,
        cache_f32.data_ptr<float>(), 0);
  });
}
"""

_ROPE_TEMPLATED_KERNEL = """\
namespace vllm {
template <typename scalar_t, typename cache_t, bool IS_NEOX>
__global__ void rotary_embedding_kernel(
    const int64_t* __restrict__ positions, scalar_t* __restrict__ query,
    scalar_t* __restrict__ key, const cache_t* __restrict__ cos_sin_cache,
    const int rot_dim) {
  // an older revision did: auto c = cos_sin_cache.to(torch::kFloat32);
  float c = static_cast<float>(cos_sin_cache[0]);
}
}  // namespace vllm
"""

ROPE_ALL_COMBINATIONS = (
    _ROPE_TEMPLATED_KERNEL
    + """
void rotary_embedding(torch::Tensor& positions, torch::Tensor& query,
                      std::optional<torch::Tensor> key, int64_t head_size,
                      torch::Tensor& cos_sin_cache, bool is_neox) {
  VLLM_DISPATCH_FLOATING_TYPES(query.scalar_type(), "rotary_embedding", [&] {
    using query_t = scalar_t;
    VLLM_DISPATCH_FLOATING_TYPES(cos_sin_cache.scalar_type(), "cache", [&] {
      vllm::rotary_embedding_kernel<query_t, scalar_t, true><<<1, 1>>>(
          positions.data_ptr<int64_t>(), query.data_ptr<query_t>(), nullptr,
          cos_sin_cache.data_ptr<scalar_t>(), 0);
    });
  });
}
"""
)

ROPE_BOUNDED = (
    _ROPE_TEMPLATED_KERNEL
    + """
template <typename query_t, typename cache_t>
static void launch(torch::Tensor& positions, torch::Tensor& query,
                   torch::Tensor& table) {
  vllm::rotary_embedding_kernel<query_t, cache_t, true><<<1, 1>>>(
      positions.data_ptr<int64_t>(), query.data_ptr<query_t>(), nullptr,
      table.data_ptr<cache_t>(), 0);
}

void rotary_embedding(torch::Tensor& positions, torch::Tensor& query,
                      std::optional<torch::Tensor> key, int64_t head_size,
                      torch::Tensor& cos_sin_cache, bool is_neox) {
  const auto table_type = cos_sin_cache.scalar_type();
  VLLM_DISPATCH_FLOATING_TYPES(query.scalar_type(), "rotary_embedding", [&] {
    if (table_type == query.scalar_type()) {
      launch<scalar_t, scalar_t>(positions, query, cos_sin_cache);
    } else if (table_type == at::ScalarType::Float) {
      launch<scalar_t, float>(positions, query, cos_sin_cache);
    } else {
      TORCH_CHECK(false, "rotary_embedding: cache dtype ", table_type,
                  " must be the query dtype ", query.scalar_type(), " or float32");
    }
  });
}
"""
)

CUSTOM_OPS_PLAIN = """\
import torch

def rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox):
    torch.ops._C.rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox)
"""

CUSTOM_OPS_CHECKED = """\
import torch

def _check_rope_cache(query, cos_sin_cache):
    if cos_sin_cache.dtype not in (query.dtype, torch.float32):
        raise ValueError(f"cache dtype {cos_sin_cache.dtype} vs query {query.dtype}")
    if cos_sin_cache.device != query.device:
        raise ValueError("cache and query on different devices")
    if cos_sin_cache.dim() != 2:
        raise ValueError("cache must be 2-D")

def rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox):
    _check_rope_cache(query, cos_sin_cache)
    torch.ops._C.rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox)
"""

CUSTOM_OPS_DTYPE_ONLY = """\
import torch

def rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox):
    if cos_sin_cache.dtype != query.dtype:
        raise ValueError("bad cache dtype")
    torch.ops._C.rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox)
"""


def test_rope_cache_dtype_na_when_cache_read_in_query_dtype(tmp_path):
    f = probe("rope-cache-dtype", make_tree(tmp_path, {KERNEL_HEAD: ROPE_SAME_TYPE}))
    assert f.state == N
    assert "query dtype" in f.reason


def test_rope_cache_dtype_absent_with_fp32_copy(tmp_path):
    f = probe("rope-cache-dtype", make_tree(tmp_path, {KERNEL_HEAD: ROPE_FP32_COPY}))
    assert f.state == A
    assert "float32" in f.reason
    assert f.hardening == {
        "python-dtype-check": False,
        "bounded-dispatch": False,
        "empty-batch": False,
    }


def test_rope_cache_dtype_present_unbounded(tmp_path):
    tree = make_tree(
        tmp_path,
        {
            "csrc/libtorch_stable/pos_encoding_kernels.cu": ROPE_ALL_COMBINATIONS,
            "vllm/_custom_ops.py": CUSTOM_OPS_PLAIN,
        },
    )
    f = probe("rope-cache-dtype", tree)
    assert f.state == P, f.reason
    assert "libtorch_stable" in f.reason
    assert f.hardening == {
        "python-dtype-check": False,
        "bounded-dispatch": False,
        "empty-batch": False,
    }


def test_rope_cache_dtype_hardened(tmp_path):
    tree = make_tree(
        tmp_path, {KERNEL_HEAD: ROPE_BOUNDED, "vllm/_custom_ops.py": CUSTOM_OPS_CHECKED}
    )
    f = probe("rope-cache-dtype", tree)
    assert f.state == P, f.reason
    assert f.hardening == {
        "python-dtype-check": True,
        "bounded-dispatch": True,
        "empty-batch": False,
    }


CUSTOM_OPS_EMPTY_BATCH = CUSTOM_OPS_CHECKED.replace(
    "    _check_rope_cache(query, cos_sin_cache)\n",
    "    _check_rope_cache(query, cos_sin_cache)\n    if positions.numel() == 0:\n        return\n",
)
CUSTOM_OPS_OTHER_RETURN = CUSTOM_OPS_CHECKED.replace(
    "    _check_rope_cache(query, cos_sin_cache)\n",
    "    _check_rope_cache(query, cos_sin_cache)\n    if is_neox:\n        return\n",
)


@pytest.mark.parametrize(
    "custom_ops,guarded",
    [(CUSTOM_OPS_EMPTY_BATCH, True), (CUSTOM_OPS_OTHER_RETURN, False), (CUSTOM_OPS_PLAIN, False)],
)
def test_rope_cache_dtype_empty_batch_guard(tmp_path, custom_ops, guarded):
    assert "numel() == 0" in custom_ops or not guarded
    tree = make_tree(tmp_path, {KERNEL_HEAD: ROPE_BOUNDED, "vllm/_custom_ops.py": custom_ops})
    assert probe("rope-cache-dtype", tree).hardening["empty-batch"] is guarded


def test_rope_cache_dtype_dtype_only_check_is_not_enough(tmp_path):
    tree = make_tree(
        tmp_path, {KERNEL_HEAD: ROPE_BOUNDED, "vllm/_custom_ops.py": CUSTOM_OPS_DTYPE_ONLY}
    )
    assert not probe("rope-cache-dtype", tree).hardening["python-dtype-check"]


# --------------------------------------------------------------------------- rope-fast-kernel

ROPE_CACHE_T = """\
namespace vllm {
template <typename scalar_t, typename cache_t, bool IS_NEOX>
__global__ void rotary_embedding_kernel(
    const int64_t* __restrict__ positions, scalar_t* __restrict__ query,
    scalar_t* __restrict__ key, const cache_t* __restrict__ cos_sin_cache,
    const int rot_dim) {
  const cache_t* row = cos_sin_cache + positions[blockIdx.x] * rot_dim;
}
}  // namespace vllm

void rotary_embedding(torch::Tensor& positions, torch::Tensor& query,
                      std::optional<torch::Tensor> key, int64_t head_size,
                      torch::Tensor& cos_sin_cache, bool is_neox) {
  int64_t num_tokens = positions.numel();
  // if (num_tokens == 0) { return; }  -- a comment is not a guard
  launch(num_tokens);
}
"""

ROPE_VECTORIZED = """\
namespace vllm {
template <typename T, int N>
struct alignas(sizeof(T) * N) Vec {
  T val[N];
};
template <typename scalar_t, typename cache_t, bool IS_NEOX, int VEC>
__global__ void rotary_embedding_kernel(
    const int64_t* __restrict__ positions, scalar_t* __restrict__ query,
    scalar_t* __restrict__ key, const cache_t* __restrict__ cos_sin_cache,
    const int rot_dim) {
  const cache_t* row = cos_sin_cache + positions[blockIdx.x] * rot_dim;
}
}  // namespace vllm

void rotary_embedding(torch::Tensor& positions, torch::Tensor& query,
                      std::optional<torch::Tensor> key, int64_t head_size,
                      torch::Tensor& cos_sin_cache, bool is_neox) {
  int64_t num_tokens = positions.numel();
  if (num_tokens == 0) {
    return;
  }
  launch(num_tokens);
}
"""


def test_rope_fast_kernel_absent_on_upstreams_kernel(tmp_path: Path) -> None:
    f = probe("rope-fast-kernel", make_tree(tmp_path, {KERNEL_HEAD: ROPE_CACHE_T}))
    assert f.state == A
    assert "no vector-width template parameter" in f.reason
    assert "no empty-batch guard" in f.reason


def test_rope_fast_kernel_present(tmp_path: Path) -> None:
    f = probe("rope-fast-kernel", make_tree(tmp_path, {KERNEL_HEAD: ROPE_VECTORIZED}))
    assert f.state == P, f.reason
    assert "(VEC)" in f.reason


def test_rope_fast_kernel_present_with_launch_bounds(tmp_path: Path) -> None:
    # the kernel's launch bounds, as a macro after void or spelled out before it
    for i, head in enumerate(
        (
            "__global__ void ROPE_LAUNCH_BOUNDS rotary_embedding_kernel(",
            "__global__ __launch_bounds__(768) void rotary_embedding_kernel(",
        )
    ):
        text = ROPE_VECTORIZED.replace("__global__ void rotary_embedding_kernel(", head)
        f = probe("rope-fast-kernel", make_tree(tmp_path / str(i), {KERNEL_HEAD: text}))
        assert f.state == P, f.reason


def test_rope_fast_kernel_needs_every_trait(tmp_path: Path) -> None:
    unaligned = ROPE_VECTORIZED.replace("struct alignas(sizeof(T) * N) Vec", "struct Vec")
    f = probe("rope-fast-kernel", make_tree(tmp_path / "a", {KERNEL_HEAD: unaligned}))
    assert f.state == A and "no aligned vector type" in f.reason
    unguarded = ROPE_VECTORIZED.replace("if (num_tokens == 0) {\n    return;\n  }", "")
    f = probe("rope-fast-kernel", make_tree(tmp_path / "b", {KERNEL_HEAD: unguarded}))
    assert f.state == A and "no empty-batch guard" in f.reason


def test_rope_fast_kernel_na_without_cache_type(tmp_path: Path) -> None:
    f = probe("rope-fast-kernel", make_tree(tmp_path, {KERNEL_HEAD: ROPE_SAME_TYPE}))
    assert f.state == N
    assert probe("rope-fast-kernel", DirTree(tmp_path / "empty")).state == N


# --------------------------------------------------------------------------- rope-bf16-buffer

ROPE_BASE = "vllm/model_executor/layers/rotary_embedding/base.py"

_BASE_HEAD = """\
import torch

class RotaryEmbeddingBase(CustomOp):
    def __init__(self, head_size, rotary_dim, max_position_embeddings, base,
                 is_neox_style, dtype, init_cache=True):
        super().__init__()
        self.use_aiter = self.enabled() and rocm_aiter_ops.is_triton_rotary_embed_enabled()
        if init_cache:
            cache = self._compute_cos_sin_cache().to(dtype)
            self.register_buffer("cos_sin_cache", cache, persistent=False)
"""

BASE_PLAIN = (
    _BASE_HEAD
    + """
    def _match_cos_sin_cache_dtype(self, query):
        cache = self.cos_sin_cache
        if cache.device == query.device and cache.dtype == query.dtype:
            return cache
        cache = cache.to(query.device, dtype=query.dtype)
        if torch.compiler.is_compiling():
            return cache
        self.cos_sin_cache = cache
        return cache
"""
)

BASE_UNUSED_EXTRA = (
    _BASE_HEAD
    + """
            if self.use_aiter and cache.dtype != torch.bfloat16:
                self.register_buffer("half_table", cache.to(torch.bfloat16), persistent=False)

    def _match_cos_sin_cache_dtype(self, query):
        cache = self.cos_sin_cache
        if cache.device == query.device and cache.dtype == query.dtype:
            return cache
        return cache.to(query.device, dtype=query.dtype)
"""
)

BASE_UPSTREAM_STYLE = (
    _BASE_HEAD
    + """
            if self.use_aiter and cache.dtype != torch.bfloat16:
                self.register_buffer("bf16_table", cache.to(torch.bfloat16), persistent=False)
            else:
                self.bf16_table = None

    def _match_cos_sin_cache_dtype(self, query):
        cache = self.cos_sin_cache
        if cache.device == query.device and cache.dtype == query.dtype:
            return cache
        if self.use_aiter and torch.compiler.is_compiling() and query.dtype == torch.bfloat16:
            other = getattr(self, "bf16_table", None)
            if other is not None and other.device == query.device:
                return other
        return cache.to(query.device, dtype=query.dtype)
"""
)

BASE_HARDENED = """\
import torch

class RotaryEmbeddingBase(CustomOp):
    def __init__(self, head_size, rotary_dim, max_position_embeddings, base,
                 is_neox_style, dtype, init_cache=True):
        super().__init__()
        self.use_aiter = self.enabled() and rocm_aiter_ops.is_triton_rotary_embed_enabled()
        if init_cache:
            cache = self._compute_cos_sin_cache().to(dtype)
            self.register_buffer("cos_sin_cache", cache, persistent=False)
            self._refresh_bf16_cache()

    def _wants_bf16_copy(self, cache):
        return (
            self.use_aiter
            and not cache.is_complex()
            and cache.dtype != torch.bfloat16
        )

    def _refresh_bf16_cache(self):
        cache = self.cos_sin_cache
        if self._wants_bf16_copy(cache):
            self.register_buffer("cos_sin_cache_bf16", cache.to(torch.bfloat16), persistent=False)
        else:
            self.cos_sin_cache_bf16 = None

    def _match_cos_sin_cache_dtype(self, query):
        cache = self.cos_sin_cache
        if cache.device == query.device and cache.dtype == query.dtype:
            return cache
        if self.use_aiter and torch.compiler.is_compiling() and query.dtype == torch.bfloat16:
            bf16 = self.cos_sin_cache_bf16
            if bf16 is not None and bf16.device == query.device and bf16.dtype == query.dtype:
                return bf16
        return cache.to(query.device, dtype=query.dtype)
"""


def test_rope_bf16_buffer_na(tmp_path):
    f = probe("rope-bf16-buffer", DirTree(tmp_path))
    assert f.state == N
    tree = make_tree(tmp_path, {ROPE_BASE: "class RotaryEmbeddingBase:\n    pass\n"})
    f = probe("rope-bf16-buffer", tree)
    assert f.state == N and "_match_cos_sin_cache_dtype" in f.reason


def test_rope_bf16_buffer_absent(tmp_path):
    f = probe("rope-bf16-buffer", make_tree(tmp_path, {ROPE_BASE: BASE_PLAIN}))
    assert f.state == A


def test_rope_bf16_buffer_absent_when_never_returned(tmp_path):
    f = probe("rope-bf16-buffer", make_tree(tmp_path, {ROPE_BASE: BASE_UNUSED_EXTRA}))
    assert f.state == A
    assert "half_table" in f.reason


def test_rope_bf16_buffer_upstream_style(tmp_path):
    f = probe("rope-bf16-buffer", make_tree(tmp_path, {ROPE_BASE: BASE_UPSTREAM_STYLE}))
    assert f.state == P, f.reason
    assert "bf16_table" in f.reason
    assert not any(f.hardening.values()), f.hardening


def test_rope_bf16_buffer_hardened(tmp_path):
    f = probe("rope-bf16-buffer", make_tree(tmp_path, {ROPE_BASE: BASE_HARDENED}))
    assert f.state == P, f.reason
    assert f.hardening == {
        "buffer-dtype-check": True,
        "no-unusable-buffer": True,
        "recompute-consistent": True,
        "refresh-in-place": False,
    }


BASE_REFRESHED_IN_PLACE = BASE_HARDENED.replace(
    """        if self._wants_bf16_copy(cache):
            self.register_buffer""",
    """        copy = self._buffers.get("cos_sin_cache_bf16")
        if copy is not None and copy.shape == cache.shape:
            copy.copy_(cache)
        elif self._wants_bf16_copy(cache):
            self.register_buffer""",
)


def test_rope_bf16_buffer_refreshed_in_place(tmp_path):
    assert BASE_REFRESHED_IN_PLACE != BASE_HARDENED
    f = probe("rope-bf16-buffer", make_tree(tmp_path, {ROPE_BASE: BASE_REFRESHED_IN_PLACE}))
    assert f.state == P, f.reason
    assert all(f.hardening.values()), f.hardening


# --------------------------------------------------------------------------- moe-bias-precast

AITER_OPS = "vllm/_aiter_ops.py"
DEEPSEEK = "vllm/model_executor/models/deepseek_v2.py"
ROUTER = "vllm/model_executor/layers/fused_moe/router/fused_topk_bias_router.py"
EXPERTS = "vllm/model_executor/layers/fused_moe/experts/rocm_aiter_moe.py"

WRAPPER_PASS = """\
import torch

class rocm_aiter_ops:
    @staticmethod
    def biased_grouped_topk(gating_output, correction_bias, topk_weights, topk_ids,
                            num_expert_group, topk_group, need_renorm):
        torch.ops.vllm.rocm_aiter_biased_grouped_topk(
            gating_output, correction_bias, topk_weights, topk_ids,
            num_expert_group, topk_group, need_renorm)
"""

WRAPPER_ON_MISMATCH = """\
import torch

class rocm_aiter_ops:
    @staticmethod
    def biased_grouped_topk(gating_output, correction_bias, topk_weights, topk_ids,
                            num_expert_group, topk_group, need_renorm):
        if gating_output.dtype != correction_bias.dtype:
            correction_bias = correction_bias.to(dtype=gating_output.dtype)
        torch.ops.vllm.rocm_aiter_biased_grouped_topk(
            gating_output, correction_bias, topk_weights, topk_ids,
            num_expert_group, topk_group, need_renorm)
"""

CALLER_CASTS = """\
def route(gating_output, bias, w, ids):
    fixed = bias.to(gating_output.dtype)
    rocm_aiter_ops.biased_grouped_topk(gating_output, fixed, w, ids, 1, 1, True)
"""

CALLER_PLAIN = """\
def route(gating_output, bias, w, ids):
    rocm_aiter_ops.biased_grouped_topk(gating_output, bias, w, ids, 1, 1, True)
"""

MOE_NO_PRECAST = """\
import torch

class DeepseekV2MoE(nn.Module):
    def __init__(self, config):
        self.gate = GateLinear(config.hidden_size, config.n_routed_experts)
        self.gate.e_score_correction_bias = nn.Parameter(torch.empty(8))
        self.use_aiter_moe = rocm_aiter_ops.is_fused_moe_enabled()
        self.gate.set_out_dtype(torch.bfloat16)
"""

MOE_PRECAST = (
    MOE_NO_PRECAST
    + """\
        if self.use_aiter_moe and self.gate.e_score_correction_bias is not None:
            bias = self.gate.e_score_correction_bias
            bias.data = bias.data.to(self.gate.out_dtype)
"""
)


def test_moe_bias_precast_na_without_wrapper(tmp_path):
    f = probe("moe-bias-precast", make_tree(tmp_path, {DEEPSEEK: MOE_PRECAST}))
    assert f.state == N and "biased_grouped_topk" in f.reason
    assert f.hardening == {}


def test_moe_bias_precast_absent(tmp_path):
    tree = make_tree(
        tmp_path, {AITER_OPS: WRAPPER_PASS, DEEPSEEK: MOE_NO_PRECAST, ROUTER: CALLER_CASTS}
    )
    f = probe("moe-bias-precast", tree)
    assert f.state == A
    assert "deepseek_v2.py" in f.reason and "fused_topk_bias_router.py" in f.reason


@pytest.mark.parametrize("broken", ["model", "wrapper", "caller"])
def test_moe_bias_precast_needs_every_part(tmp_path, broken):
    files = {AITER_OPS: WRAPPER_ON_MISMATCH, DEEPSEEK: MOE_PRECAST, EXPERTS: CALLER_PLAIN}
    if broken == "model":
        files[DEEPSEEK] = MOE_NO_PRECAST
    elif broken == "wrapper":
        files[AITER_OPS] = WRAPPER_PASS
    else:
        files[ROUTER] = CALLER_CASTS
    assert probe("moe-bias-precast", make_tree(tmp_path, files)).state == A


def test_moe_bias_precast_present(tmp_path):
    tree = make_tree(
        tmp_path,
        {
            AITER_OPS: WRAPPER_ON_MISMATCH,
            DEEPSEEK: MOE_PRECAST,
            ROUTER: CALLER_PLAIN,
            EXPERTS: CALLER_PLAIN,
        },
    )
    f = probe("moe-bias-precast", tree)
    assert f.state == P, f.reason
    assert "2 AITER router caller" in f.reason


# --------------------------------------------------------------------------- dsv32-decode

SPARSE = "vllm/v1/attention/backends/mla/rocm_aiter_mla_sparse.py"

ROUTER_FP32 = """\
import torch

class DeepseekV2MoE(nn.Module):
    def __init__(self, config):
        self.gate = GateLinear(config.hidden_size, config.n_routed_experts)
        self.gate.e_score_correction_bias = nn.Parameter(torch.empty(8))
        self.is_rocm_aiter_moe_enabled = rocm_aiter_ops.is_fused_moe_enabled()
        if self.is_rocm_aiter_moe_enabled and self.gate.e_score_correction_bias is not None:
            self.gate.set_out_dtype(torch.float32)
"""

ROUTER_BF16 = ROUTER_FP32.replace(
    "set_out_dtype(torch.float32)", "set_out_dtype(self.gate.weight.dtype)"
)

ROUTER_GUARDED = (
    ROUTER_FP32
    + """
    def keep_bf16_router_if_safe(self):
        bias = self.gate.e_score_correction_bias
        scores = torch.rand(64, bias.numel())
        same = torch.equal(
            torch.topk(scores + bias, 2).indices,
            torch.topk(scores + bias.to(torch.bfloat16).float(), 2).indices,
        )
        if same:
            self.gate.out_dtype = self.gate.weight.dtype
            bias.data = bias.data.to(torch.bfloat16)


class DeepseekV2Model(nn.Module):
    def load_weights(self, weights):
        for layer in self.layers:
            layer.mlp.keep_bf16_router_if_safe()
"""
)

_BUILDER_HEAD = """\
import numpy as np
import torch

class ROCMAiterMLASparseMetadataBuilder(AttentionMetadataBuilder):
    def __init__(self, device):
        self.req_ids = torch.zeros(1024, dtype=torch.int32)
        self.indices = torch.empty(1024, dtype=torch.int32)
        self.indptr = torch.zeros(1025, dtype=torch.int32)
        self._last_key = None
        self._req_extent = 0

    def build(self, common_prefix_len, cm, fast_build=False):
        num_tokens = cm.num_actual_tokens
"""

BUILDER_NO_METADATA = (
    _BUILDER_HEAD
    + """\
        self.req_ids.fill_(0)
        self.indices.fill_(0)
        self.indptr.fill_(0)
        return num_tokens
"""
)

BUILDER_EVERY_BUILD = (
    _BUILDER_HEAD
    + """\
        self.req_ids.fill_(0)
        self.indices.fill_(0)
        self.indptr.fill_(0)
        from aiter import get_mla_metadata_v1
        get_mla_metadata_v1(self.indptr, self.indices)
        return num_tokens
"""
)

BUILDER_CACHED = (
    _BUILDER_HEAD
    + """\
        new_extent = num_tokens
        if self._req_extent > new_extent:
            self.req_ids[new_extent : self._req_extent].fill_(0)
        self._req_extent = new_extent
        seq_lens = cm.seq_lens_cpu[: cm.num_reqs].numpy()
        key = (num_tokens, int(cm.max_query_len), np.minimum(seq_lens, 2048).tobytes())
        if key != self._last_key:
            from aiter import get_mla_metadata_v1
            get_mla_metadata_v1(self.indptr, self.indices)
            self._last_key = key
        return num_tokens
"""
)

BUILDER_HARDENED = (
    _BUILDER_HEAD
    + """\
        new_extent = num_tokens
        if self._req_extent > new_extent:
            self.req_ids[new_extent : self._req_extent].fill_(0)
        self._req_extent = new_extent
        host_lens = cm._seq_lens_cpu
        if host_lens is None:
            key = None
        else:
            starts = cm.query_start_loc_cpu.numpy()
            q_lens = np.diff(starts)
            ctx = host_lens[: cm.num_reqs].numpy() - q_lens
            key = (num_tokens, q_lens.tobytes(), np.minimum(ctx, 2048).tobytes())
        if key is None or key != self._last_key:
            from aiter import get_mla_metadata_v1
            get_mla_metadata_v1(self.indptr, self.indices)
            self._last_key = key
        return num_tokens
"""
)


def test_dsv32_na_without_sparse_backend(tmp_path):
    f = probe("dsv32-decode", make_tree(tmp_path, {DEEPSEEK: ROUTER_BF16}))
    assert f.state == N and "rocm_aiter_mla_sparse.py" in f.reason


def test_dsv32_absent_lists_missing_parts(tmp_path):
    tree = make_tree(tmp_path, {DEEPSEEK: ROUTER_FP32, SPARSE: BUILDER_EVERY_BUILD})
    f = probe("dsv32-decode", tree)
    assert f.state == A
    for part in ("router", "metadata-cache", "tail-fills"):
        assert part in f.reason


def test_dsv32_partial_is_absent(tmp_path):
    tree = make_tree(tmp_path, {DEEPSEEK: ROUTER_BF16, SPARSE: BUILDER_EVERY_BUILD})
    f = probe("dsv32-decode", tree)
    assert f.state == A
    assert "router" not in f.reason and "metadata-cache" in f.reason


def test_dsv32_without_metadata_call_needs_only_fills(tmp_path):
    # Older builders never call get_mla_metadata_v1: that part is n/a.
    tree = make_tree(tmp_path, {DEEPSEEK: ROUTER_BF16, SPARSE: BUILDER_NO_METADATA})
    f = probe("dsv32-decode", tree)
    assert f.state == A and "tail-fills" in f.reason and "n/a" in f.reason
    # nor do the metadata key's hardening items: only the router's is counted
    assert f.hardening == {"bias-precision-guard": False}
    assert f.hardening_na == {"complete-metadata-key", "no-reuse-without-host-seqlens"}
    fills_only = BUILDER_CACHED.replace("get_mla_metadata_v1", "other_call")
    tree = make_tree(tmp_path, {SPARSE: fills_only})
    assert probe("dsv32-decode", tree).state == P


def test_dsv32_upstream_style(tmp_path):
    tree = make_tree(tmp_path, {DEEPSEEK: ROUTER_BF16, SPARSE: BUILDER_CACHED})
    f = probe("dsv32-decode", tree)
    assert f.state == P, f.reason
    assert f.hardening == {
        "complete-metadata-key": False,
        "no-reuse-without-host-seqlens": False,
        "bias-precision-guard": False,
    }


def test_dsv32_hardened(tmp_path):
    tree = make_tree(tmp_path, {DEEPSEEK: ROUTER_GUARDED, SPARSE: BUILDER_HARDENED})
    f = probe("dsv32-decode", tree)
    assert f.state == P, f.reason
    assert f.hardening == {
        "complete-metadata-key": True,
        "no-reuse-without-host-seqlens": True,
        "bias-precision-guard": True,
    }


def test_dsv32_guard_must_run_after_load(tmp_path):
    not_called = ROUTER_GUARDED.replace("layer.mlp.keep_bf16_router_if_safe()", "pass")
    tree = make_tree(tmp_path, {DEEPSEEK: not_called, SPARSE: BUILDER_HARDENED})
    f = probe("dsv32-decode", tree)
    assert not f.hardening["bias-precision-guard"]
    assert f.state == A and "float32" in f.reason


def test_dsv32_key_bypass_counts_as_complete(tmp_path):
    bypass = BUILDER_CACHED.replace(
        "if key != self._last_key:", "if cm.max_query_len > 1 or key != self._last_key:"
    )
    tree = make_tree(tmp_path, {DEEPSEEK: ROUTER_BF16, SPARSE: bypass})
    assert probe("dsv32-decode", tree).hardening["complete-metadata-key"]


# --------------------------------------------------------------------------- ar-rms-pack-gate

_AR_HEAD = """\
import torch

def _rocm_aiter_fused_allreduce_rmsnorm_impl(input_, residual, weight, epsilon):
    aiter_ar = rocm_aiter_ops.get_aiter_allreduce()
    hidden_dim = input_.shape[-1]
"""

AR_WHITELIST = (
    _AR_HEAD
    + """\
    hidden_ok = hidden_dim in (512, 1024, 2048, 4096, 7168)
    use_1stage = hidden_ok and input_.shape[0] <= 80
    return aiter_ar.fused_ar_rms(input_, residual, w=weight, eps=epsilon, use_1stage=use_1stage)
"""
)

AR_PACK = (
    _AR_HEAD
    + """\
    per_pack = 16 // input_.element_size()
    hidden_ok = hidden_dim % per_pack == 0 and hidden_dim // per_pack <= 1024
    use_1stage = hidden_ok and input_.shape[0] <= 80
    return aiter_ar.fused_ar_rms(input_, residual, w=weight, eps=epsilon, use_1stage=use_1stage)
"""
)

AR_PACK_SWITCH = """\
import os

_FORCE_TWO = os.environ.get("VLLM_ROCM_AITER_AR_RMS_FORCE_2STAGE", "0") == "1"

""" + AR_PACK.replace("    use_1stage = hidden_ok", "    use_1stage = not _FORCE_TWO and hidden_ok")

AR_DELEGATING = (
    _AR_HEAD
    + """\
    use_1stage = aiter_ar.may_use_one_stage(input_)
    return aiter_ar.fused_ar_rms(input_, residual, w=weight, eps=epsilon, use_1stage=use_1stage)
"""
)

AR_COMM = """\
import vllm.envs as envs

PACK_BYTES = 16

class AiterAllreduce:
    def may_use_one_stage(self, inp):
        if envs.VLLM_ROCM_AITER_TWO_STAGE_ONLY:
            return False
        pack = PACK_BYTES // inp.element_size()
        return inp.shape[-1] % pack == 0 and inp.shape[-1] // pack <= 1024
"""


def test_ar_rms_na_without_op(tmp_path):
    f = probe("ar-rms-pack-gate", make_tree(tmp_path, {AITER_OPS: "import torch\n"}))
    assert f.state == N
    assert "_rocm_aiter_fused_allreduce_rmsnorm_impl" in f.reason


def test_ar_rms_whitelist_is_absent(tmp_path):
    f = probe("ar-rms-pack-gate", make_tree(tmp_path, {AITER_OPS: AR_WHITELIST}))
    assert f.state == A and "whitelist" in f.reason


def test_ar_rms_pack_rule_is_present(tmp_path):
    f = probe("ar-rms-pack-gate", make_tree(tmp_path, {AITER_OPS: AR_PACK}))
    assert f.state == P, f.reason
    assert f.hardening == {"two-stage-switch": False}


def test_ar_rms_two_stage_switch(tmp_path):
    f = probe("ar-rms-pack-gate", make_tree(tmp_path, {AITER_OPS: AR_PACK_SWITCH}))
    assert f.state == P, f.reason
    assert f.hardening == {"two-stage-switch": True}


def test_ar_rms_gate_in_communicator(tmp_path):
    tree = make_tree(
        tmp_path,
        {
            AITER_OPS: AR_DELEGATING,
            "vllm/distributed/device_communicators/aiter_custom_all_reduce.py": AR_COMM,
        },
    )
    f = probe("ar-rms-pack-gate", tree)
    assert f.state == P and "may_use_one_stage" in f.reason
    assert f.hardening == {"two-stage-switch": True}


def test_ar_rms_no_rule_found_is_absent(tmp_path):
    f = probe("ar-rms-pack-gate", make_tree(tmp_path, {AITER_OPS: AR_DELEGATING}))
    assert f.state == A


ROUTER_GUARDED_BY_TIES = (
    ROUTER_FP32
    + """
    def narrow_router(self):
        bias = self.gate.e_score_correction_bias
        values = torch.unique(bias.data)
        if torch.unique(values.to(self.gate.weight.dtype)).numel() == values.numel():
            self.gate.out_dtype = self.gate.weight.dtype


def narrow_all(model):
    for m in model.modules():
        m.narrow_router()


class DeepseekV2ForCausalLM(nn.Module):
    def load_weights(self, weights):
        loaded = self.model.load(weights)
        narrow_all(self)
        return loaded
"""
)


def test_dsv32_guard_by_distinct_values(tmp_path):
    tree = make_tree(tmp_path, {DEEPSEEK: ROUTER_GUARDED_BY_TIES, SPARSE: BUILDER_CACHED})
    f = probe("dsv32-decode", tree)
    assert f.state == P, f.reason
    assert f.hardening["bias-precision-guard"]


def test_dsv32_none_check_alone_is_no_complete_key(tmp_path):
    only_none = BUILDER_CACHED.replace(
        "if key != self._last_key:", "if key is None or key != self._last_key:"
    )
    tree = make_tree(tmp_path, {DEEPSEEK: ROUTER_BF16, SPARSE: only_none})
    assert not probe("dsv32-decode", tree).hardening["complete-metadata-key"]


def test_dsv32_key_on_per_token_lengths(tmp_path):
    per_token = BUILDER_CACHED.replace(
        "key = (num_tokens, int(cm.max_query_len), np.minimum(seq_lens, 2048).tobytes())",
        "starts = cm.query_start_loc_cpu.numpy()\n"
        "        kv_lens = per_token_kv_lens(starts, seq_lens, 2048)\n"
        "        key = (num_tokens, kv_lens.tobytes())",
    )
    assert per_token != BUILDER_CACHED
    tree = make_tree(tmp_path, {DEEPSEEK: ROUTER_BF16, SPARSE: per_token})
    assert probe("dsv32-decode", tree).hardening["complete-metadata-key"]


def test_dsv32_metadata_call_in_helper_method(tmp_path):
    helper = BUILDER_CACHED.replace(
        "            from aiter import get_mla_metadata_v1\n"
        "            get_mla_metadata_v1(self.indptr, self.indices)\n",
        "            self._plan_work()\n",
    ) + (
        "\n    def _plan_work(self):\n"
        "        from aiter import get_mla_metadata_v1\n"
        "        get_mla_metadata_v1(self.indptr, self.indices)\n"
    )
    assert "_plan_work" in helper
    tree = make_tree(tmp_path, {DEEPSEEK: ROUTER_BF16, SPARSE: helper})
    f = probe("dsv32-decode", tree)
    assert f.state == P, f.reason
    every_build = helper.replace("if key != self._last_key:", "if True:")
    tree = make_tree(tmp_path, {SPARSE: every_build})
    f = probe("dsv32-decode", tree)
    assert f.state == A and "metadata-cache" in f.reason


def test_rope_error_message_is_not_a_copy(tmp_path):
    text = ROPE_BOUNDED.replace(
        '" or float32");', '" or float32; convert it with cos_sin_cache.to(torch.float32)");'
    )
    assert text != ROPE_BOUNDED
    assert probe("rope-cache-dtype", make_tree(tmp_path, {KERNEL_HEAD: text})).state == P


def test_gittree_rejects_option_like_rev(tmp_path):
    with pytest.raises(ValueError):
        GitTree(tmp_path, "--all")


@pytest.mark.parametrize(
    ("real_check", "expected"),
    [("cache.is_floating_point()", True), ("cache.numel() > 0", False)],
)
def test_rope_bf16_buffer_real_cache_check(tmp_path, real_check, expected):
    text = BASE_HARDENED.replace("not cache.is_complex()", real_check)
    assert text != BASE_HARDENED
    f = probe("rope-bf16-buffer", make_tree(tmp_path, {ROPE_BASE: text}))
    assert f.state == P
    assert f.hardening["no-unusable-buffer"] is expected


def test_ar_rms_switch_through_class_attribute(tmp_path):
    text = """\
import vllm.envs as envs

class rocm_aiter_ops:
    _AR_RMS_ONE_SHOT = envs.VLLM_ROCM_AITER_AR_RMS_ONE_SHOT

    @classmethod
    def fused_ar_rms_one_shot_allowed(cls):
        return cls._AR_RMS_ONE_SHOT

""" + AR_PACK.replace(
        "    use_1stage = hidden_ok",
        "    use_1stage = rocm_aiter_ops.fused_ar_rms_one_shot_allowed() and hidden_ok",
    )
    f = probe("ar-rms-pack-gate", make_tree(tmp_path, {AITER_OPS: text}))
    assert f.state == P and f.hardening == {"two-stage-switch": True}
    unrelated = text.replace("AR_RMS_ONE_SHOT", "AR_RMS_ENABLED")
    f = probe("ar-rms-pack-gate", make_tree(tmp_path, {AITER_OPS: unrelated}))
    assert f.hardening == {"two-stage-switch": False}


ROUTER_GUARDED_BY_HELPER = (
    ROUTER_FP32
    + """
    def choose_router_dtype(self):
        bias = self.gate.e_score_correction_bias
        dtype = self.gate.weight.dtype
        reference = _selected_experts(self.probe_logits, bias.float())
        rounded = _selected_experts(self.probe_logits, bias.to(dtype).float())
        if (rounded != reference).any():
            return
        self.gate.out_dtype = dtype


def _selected_experts(logits, bias):
    return (logits.sigmoid() + bias).topk(8, dim=-1).indices


def choose_all(model):
    for m in model.modules():
        m.choose_router_dtype()


class DeepseekV2ForCausalLM(nn.Module):
    def load_weights(self, weights):
        loaded = self.model.load(weights)
        choose_all(self)
        return loaded
"""
)


def test_dsv32_guard_selection_in_called_helper(tmp_path):
    """The expert selection compared before/after rounding may live in a helper."""
    tree = make_tree(tmp_path, {DEEPSEEK: ROUTER_GUARDED_BY_HELPER, SPARSE: BUILDER_CACHED})
    f = probe("dsv32-decode", tree)
    assert f.state == P, f.reason
    assert f.hardening["bias-precision-guard"]


def test_ar_rms_switch_asked_from_the_communicator(tmp_path):
    # 0.33.0 layout: the gate lives in the communicator, the switch in
    # rocm_aiter_ops (a class attribute read from the environment).
    ops = (
        """\
import vllm.envs as envs

class rocm_aiter_ops:
    _AR_RMS_FORCE_2STAGE = envs.VLLM_ROCM_AITER_AR_RMS_FORCE_2STAGE

    @classmethod
    def is_fused_allreduce_rmsnorm_2stage_forced(cls):
        return cls._AR_RMS_FORCE_2STAGE

"""
        + AR_DELEGATING
    )
    comm = AR_COMM.replace(
        "        if envs.VLLM_ROCM_AITER_TWO_STAGE_ONLY:",
        "        if rocm_aiter_ops.is_fused_allreduce_rmsnorm_2stage_forced():",
    )
    assert comm != AR_COMM
    path = "vllm/distributed/device_communicators/aiter_custom_all_reduce.py"
    f = probe("ar-rms-pack-gate", make_tree(tmp_path, {AITER_OPS: ops, path: comm}))
    assert f.state == P and f.hardening == {"two-stage-switch": True}
    plain = comm.replace(
        "        if rocm_aiter_ops.is_fused_allreduce_rmsnorm_2stage_forced():\n"
        "            return False\n",
        "",
    )
    assert plain != comm
    f = probe("ar-rms-pack-gate", make_tree(tmp_path / "plain", {AITER_OPS: ops, path: plain}))
    assert f.state == P and f.hardening == {"two-stage-switch": False}
