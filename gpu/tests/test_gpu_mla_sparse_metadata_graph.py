# SPDX-License-Identifier: Apache-2.0
"""Sparse-MLA (DeepSeek-V3.2) metadata in the builder's persistent buffers,
read by a captured CUDA graph: after each rebuild for a new batch (grown,
shrunk, same shape with other lengths, the scripted sequences of the tree's
own reuse test), a replay issued right after build() must read what a fresh
builder computes for that batch. The builder's Triton kernels run for real;
``aiter.get_mla_metadata_v1`` is the simulation's fingerprinting stand-in.

Uses the helpers of the tree's ``tests/rocm/aiter/test_mla_sparse_metadata_reuse.py``
(skipped where the tree has none). ``pytest -p vllm_rocm_sim.plugin -p fork_gpu``.
"""

import dataclasses
import importlib.util
from pathlib import Path

import pytest
import torch

FORK_PATCHES = ("Harden the sparse MLA work metadata reuse and tail fills",)

pytestmark = pytest.mark.gpu

HELPERS = Path("tests/rocm/aiter/test_mla_sparse_metadata_reuse.py")


def _helpers():
    path = Path.cwd() / HELPERS
    if not path.is_file():
        return None
    spec = importlib.util.spec_from_file_location("fork_mla_reuse_helpers", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


helpers = _helpers()
if helpers is None or not hasattr(helpers, "SCENARIOS"):
    pytest.skip(f"the tree has no {HELPERS} with SCENARIOS", allow_module_level=True)

DEVICE_FIELDS = ("query_start_loc", "seq_lens", "block_table_tensor", "slot_mapping")
# The builder's Triton kernel takes the top-k in blocks of 128; the CPU
# helpers use 8. Sequence lengths of their scenarios are scaled alike, so
# that they stand where they stood relative to the top-k.
TOPK = 128
SCALE = TOPK // helpers.TOPK


def scaled(batch):
    return dataclasses.replace(
        batch,
        seq_lens=tuple(s * SCALE for s in batch.seq_lens),
        num_tokens=helpers.MAX_TOKENS,  # one padded full-graph batch size
    )


@pytest.fixture
def sparse_mla(rocm_sim, aiter_env, monkeypatch):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    import vllm.v1.attention.backends.mla.rocm_aiter_mla_sparse as mod

    builder_cls = mod.ROCMAiterMLASparseMetadataBuilder

    def on_cuda(spec, layer_names, vllm_config, device):
        return builder_cls(spec, layer_names, vllm_config, torch.device("cuda"))

    monkeypatch.setattr(mod, "ROCMAiterMLASparseMetadataBuilder", on_cuda)
    monkeypatch.setattr(helpers, "TOPK", TOPK)
    common = helpers.Batch.common

    def common_on_cuda(self):
        cm = common(self)
        return dataclasses.replace(
            cm, **{f: getattr(cm, f).cuda() for f in DEVICE_FIELDS if hasattr(cm, f)}
        )

    monkeypatch.setattr(helpers.Batch, "common", common_on_cuda)
    topk = helpers.topk_indices
    monkeypatch.setattr(helpers, "topk_indices", lambda batch, seed: topk(batch, seed).cuda())
    convert = mod.triton_convert_req_index_to_global_index

    def convert_scheduled_rows(req_id, block_table, token_indices, *args, **kwargs):
        # The helpers draw top-k indices for the padded batch; a builder that
        # sizes req_id_per_token by the scheduled tokens (0.33.0) leaves the
        # padding rows out, and its kernel checks that both agree.
        return convert(req_id, block_table, token_indices[: req_id.shape[0]], *args, **kwargs)

    monkeypatch.setattr(mod, "triton_convert_req_index_to_global_index", convert_scheduled_rows)
    return mod


def persistent(builder, n: int) -> list[torch.Tensor]:
    """What a padded decode step of n tokens reads from the builder."""
    return [
        *(getattr(builder, name) for name in helpers.WORK_BUFFERS),
        builder.paged_kv_indptr[: n + 1],
        builder.req_id_per_token_buffer[:n],
        builder.paged_kv_indices,
    ]


def capture_reader(builder, n: int):
    sources = persistent(builder, n)
    outs = [torch.empty_like(s) for s in sources]
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for out, src in zip(outs, sources, strict=True):
            out.copy_(src)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for out, src in zip(outs, sources, strict=True):
            out.copy_(src)
    return graph, outs


def _scenarios() -> dict[str, tuple[int, list]]:
    """name -> (draft tokens per request, steps). Later trees give every
    scenario as (draft tokens, steps); earlier ones give the plain scenarios
    as steps and those under speculative decoding in SPEC_SCENARIOS."""
    out = {}
    for name, script in helpers.SCENARIOS.items():
        out[name] = script if isinstance(script, tuple) else (0, script)
    out.update(getattr(helpers, "SPEC_SCENARIOS", {}))
    return out


SCENARIOS = _scenarios()


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_replay_reads_the_rebuilt_metadata(sparse_mla, scenario):
    n = helpers.MAX_TOKENS
    spec_tokens, script = SCENARIOS[scenario]
    steps = [scaled(batch) for batch, _ in script]
    # The builder is configured as the model runner configures it: a batch
    # whose host seq_lens are only an optimistic bound (drafts not yet
    # confirmed) occurs only with speculative decoding, and a builder told
    # there is none takes that bound for the exact KV end.
    builder = helpers.make_builder(sparse_mla, spec_tokens=spec_tokens)
    helpers.run_step(sparse_mla, builder, steps[0], seed=0)
    graph, outs = capture_reader(builder, n)
    for seed, batch in enumerate(steps):
        helpers.run_step(sparse_mla, builder, batch, seed=seed)
        graph.replay()  # no synchronize between the build and the replay
        fresh = helpers.make_builder(sparse_mla, spec_tokens=spec_tokens)
        helpers.run_step(sparse_mla, fresh, batch, seed=seed)
        torch.cuda.synchronize()
        for i, (out, ref) in enumerate(zip(outs, persistent(fresh, n), strict=True)):
            torch.testing.assert_close(out, ref, msg=f"step {seed}, buffer {i}: stale")


def test_grow_shrink_and_same_shape(sparse_mla):
    n = helpers.MAX_TOKENS
    decode = helpers.decode
    steps = [
        scaled(decode([20, 30, 40])),
        scaled(decode([21, 31, 41, 3, 5, 2])),  # grown
        scaled(decode([22, 4])),  # shrunk
        scaled(decode([3, 6])),  # same shape, other lengths (below the top-k)
        scaled(decode([4, 7])),
    ]
    builder = helpers.make_builder(sparse_mla)
    helpers.run_step(sparse_mla, builder, steps[0], seed=0)
    graph, outs = capture_reader(builder, n)
    for seed, batch in enumerate(steps):
        helpers.run_step(sparse_mla, builder, batch, seed=seed)
        graph.replay()
        fresh = helpers.make_builder(sparse_mla)
        helpers.run_step(sparse_mla, fresh, batch, seed=seed)
        torch.cuda.synchronize()
        for i, (out, ref) in enumerate(zip(outs, persistent(fresh, n), strict=True)):
            torch.testing.assert_close(out, ref, msg=f"step {seed}, buffer {i}: stale")
