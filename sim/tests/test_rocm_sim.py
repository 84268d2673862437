# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Self-test of the ROCm simulation. It imports vLLM, so it runs inside a
vLLM tree: ``vllm-fork test`` runs it with the fork's own tests, as
``PYTHONPATH=<fork>/sim pytest -p vllm_rocm_sim.plugin <fork>/sim/tests``."""

import pytest
import torch

pytestmark = pytest.mark.usefixtures("rocm_sim")


def test_platform_is_simulated_rocm(rocm_sim):
    from vllm.platforms import current_platform
    from vllm.platforms.rocm import RocmPlatform, on_gfx942, on_mi3xx

    assert isinstance(current_platform, RocmPlatform)
    assert current_platform.is_rocm()
    assert rocm_sim.arch == "gfx942"
    assert on_mi3xx() and on_gfx942()
    assert current_platform.get_device_name() == "AMD_Instinct_MI300X"


def test_rocm_arch_switches_to_mi355(rocm_arch):
    from vllm.platforms import current_platform
    from vllm.platforms.rocm import on_gfx942, on_gfx950, on_mi3xx

    rocm_arch("gfx950")
    assert on_gfx950() and on_mi3xx() and not on_gfx942()
    assert current_platform.get_device_capability().to_int() == 95


def test_gates_follow_env(aiter_env):
    from vllm._aiter_ops import rocm_aiter_ops

    assert rocm_aiter_ops.is_enabled()
    assert rocm_aiter_ops.is_fused_moe_enabled()
    aiter_env.set("VLLM_ROCM_USE_AITER_MOE", "0")
    assert not rocm_aiter_ops.is_fused_moe_enabled()
    aiter_env.unset("VLLM_ROCM_USE_AITER")
    assert not rocm_aiter_ops.is_enabled()


def test_gates_off_without_env(rocm_sim, monkeypatch):
    from vllm._aiter_ops import rocm_aiter_ops

    monkeypatch.delenv("VLLM_ROCM_USE_AITER", raising=False)
    rocm_aiter_ops.refresh_env_variables()
    assert not rocm_aiter_ops.is_enabled()
    assert not rocm_aiter_ops.is_fused_moe_enabled()


def _deepseek_v3_routing(logits, bias, topk, groups, topk_group):
    scores = logits.float().sigmoid()
    choice = scores + bias.float()
    per_group = choice.view(len(logits), groups, -1).topk(2, dim=-1)[0].sum(-1)
    keep = torch.zeros_like(per_group).scatter_(1, per_group.topk(topk_group, dim=-1)[1], 1.0)
    keep = keep.repeat_interleave(logits.shape[-1] // groups, dim=-1)
    ids = choice.masked_fill(keep == 0, float("-inf")).topk(topk, dim=-1)[1]
    weights = scores.gather(1, ids)
    return weights / weights.sum(-1, keepdim=True), ids


def test_biased_grouped_topk_through_cpu_op(aiter_env, aiter_cpu_ops, sim_calls):
    from vllm._aiter_ops import rocm_aiter_ops

    torch.manual_seed(0)
    logits = torch.randn(5, 16, dtype=torch.bfloat16)
    bias = torch.randn(16, dtype=torch.bfloat16) * 0.1
    weights = torch.empty(5, 4, dtype=torch.float32)
    ids = torch.empty(5, 4, dtype=torch.int32)

    with pytest.raises(NotImplementedError):
        torch.ops.vllm.rocm_aiter_biased_grouped_topk(logits, bias, weights, ids, 4, 2, True, 1.0)
    aiter_cpu_ops.register("rocm_aiter_biased_grouped_topk")
    rocm_aiter_ops.biased_grouped_topk(logits, bias, weights, ids, 4, 2, True)

    ref_w, ref_ids = _deepseek_v3_routing(logits, bias, 4, 4, 2)
    order, ref_order = ids.long().sort(-1), ref_ids.sort(-1)
    torch.testing.assert_close(order.values, ref_order.values)
    torch.testing.assert_close(weights.gather(1, order.indices), ref_w.gather(1, ref_order.indices))
    assert sim_calls.names() == [
        "vllm::rocm_aiter_biased_grouped_topk",
        "aiter.biased_grouped_topk",
    ]


@pytest.mark.parametrize("groups", [3, 5, 16])
def test_biased_grouped_topk_refuses_a_group_count_without_kernel(aiter_env, groups):
    import aiter

    logits = torch.randn(2, 48)
    weights = torch.empty(2, 4)
    ids = torch.empty(2, 4, dtype=torch.int32)
    with pytest.raises(RuntimeError, match=f"Unsupported num_expert_group: {groups}"):
        aiter.biased_grouped_topk(logits, torch.zeros(48), weights, ids, groups, groups, True)
    # the counts the kernel has run
    for supported in (1, 2, 4, 8):
        aiter.biased_grouped_topk(logits, torch.zeros(48), weights, ids, supported, 1, True)


def test_fake_aiter_function_can_be_replaced(aiter_env, aiter_cpu_ops, monkeypatch):
    import aiter

    seen = []
    monkeypatch.setattr(aiter, "topk_sigmoid", lambda w, i, g: seen.append(g.shape))
    aiter_cpu_ops.register("rocm_aiter_topk_sigmoid")
    torch.ops.vllm.rocm_aiter_topk_sigmoid(
        torch.empty(2, 1), torch.empty(2, 1, dtype=torch.int32), torch.zeros(2, 8)
    )
    assert seen == [torch.Size([2, 8])]


def test_mla_metadata_depends_on_inputs(rocm_sim, sim_calls):
    import aiter

    def build(kv_indptr):
        outs = [torch.zeros(4, dtype=torch.int32) for _ in range(6)]
        qo = torch.arange(4, dtype=torch.int32)
        aiter.get_mla_metadata_v1(qo, kv_indptr, torch.ones(3), 16, 1, True, *outs)
        return outs

    a = build(torch.tensor([0, 2, 4, 6], dtype=torch.int32))
    b = build(torch.tensor([0, 2, 4, 6], dtype=torch.int32))
    c = build(torch.tensor([0, 2, 5, 6], dtype=torch.int32))
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert not torch.equal(a[0], c[0])
    assert sim_calls.count("aiter.get_mla_metadata_v1") == 3


def test_stream_capture_is_simulated(rocm_sim, stream_capture):
    assert torch.cuda.is_current_stream_capturing() is False
    with stream_capture():
        assert torch.cuda.is_current_stream_capturing() is True
    assert torch.cuda.is_current_stream_capturing() is False


def test_stream_syncs_are_recorded_in_order(rocm_sim, sim_calls):
    import aiter

    qo = torch.tensor([0, 1, 2], dtype=torch.int32)
    kv = torch.tensor([0, 3, 6], dtype=torch.int32)
    last = torch.ones(2, dtype=torch.int32)
    outs = [torch.empty(4, dtype=torch.int32) for _ in range(6)]
    aiter.get_mla_metadata_v1(qo, kv, last, 16, 1, True, *outs)
    torch.cuda.current_stream("cuda:1").synchronize()
    torch.cuda.synchronize()
    assert sim_calls.names() == [
        "aiter.get_mla_metadata_v1",
        "torch.cuda.Stream.synchronize",
        "torch.cuda.synchronize",
    ]
    assert sim_calls.named("torch.cuda.Stream.synchronize")[0].kwargs == {"device": "cuda:1"}
    assert sim_calls.named("torch.cuda.synchronize")[0].kwargs == {"device": None}


def test_pinning_helpers_work_without_a_device(rocm_sim):
    import numpy as np

    torch_utils = pytest.importorskip("vllm.utils.torch_utils")
    if not hasattr(torch_utils, "np_to_pinned_tensor"):
        pytest.skip("this release has no pinning helper")
    out = torch_utils.np_to_pinned_tensor(np.arange(4, dtype=np.int32))
    assert out.tolist() == [0, 1, 2, 3]


def test_cpu_dist_env(cpu_dist_env):
    from vllm.distributed import (
        get_ep_group,
        get_tensor_model_parallel_world_size,
    )

    assert get_tensor_model_parallel_world_size() == 1
    assert get_ep_group().world_size == 1


def test_triton_rope_through_cpu_op(aiter_env, aiter_cpu_ops, sim_calls):
    from vllm._aiter_ops import _triton_rotary_embedding_impl

    aiter_cpu_ops.register("rocm_aiter_triton_rotary_embedding", impl=_triton_rotary_embedding_impl)
    torch.manual_seed(0)
    head, rot = 8, 8
    angles = torch.rand(16, rot // 2) * 6.0
    cache = torch.cat((angles.cos(), angles.sin()), dim=-1)
    positions = torch.tensor([3, 0, 15])
    query = torch.randn(3, 2 * head)
    key = torch.randn(3, head)

    def neox(x, heads):
        x = x.view(3, heads, head)
        c = angles[positions].cos().unsqueeze(1)
        s = angles[positions].sin().unsqueeze(1)
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), -1).view(3, -1)

    ref_q, ref_k = neox(query, 2), neox(key, 1)
    torch.ops.vllm.rocm_aiter_triton_rotary_embedding(positions, query, key, head, cache, True)
    torch.testing.assert_close(query, ref_q)
    torch.testing.assert_close(key, ref_k)
    assert sim_calls.names() == [
        "vllm::rocm_aiter_triton_rotary_embedding",
        "aiter.rope_cached_thd_positions_offsets_2c_fwd_inplace",
    ]
