# SPDX-License-Identifier: Apache-2.0
"""DeepSeek router with a narrowed (bf16) correction bias, captured in a CUDA
graph: weights reloaded in place and by the streaming update must reach the
graph's replay, which reads the storage it was captured on.

Runs in a vLLM tree under the ROCm simulation (the AITER router path), on a
CUDA device: ``pytest -p vllm_rocm_sim.plugin -p fork_gpu``.
"""

from types import SimpleNamespace

import pytest
import torch

FORK_PATCHES = ("Narrow the router dtype only when the loaded bias survives it",)

pytestmark = pytest.mark.gpu

NUM_EXPERTS = 16
TOP_K = 2
HIDDEN = 32
TOKENS = 8
# aux-loss-free balancing steps of 0.001: bf16 keeps them apart (narrowed)
FIRST = torch.tensor([-12, -7, -3, 0, 0, 1, 2, 4, 5, 9, 17, 33, 48, 61, 90, 120]) * 0.001


@pytest.fixture(scope="module")
def dist_env():
    from vllm.config import DeviceConfig, VllmConfig, set_current_vllm_config
    from vllm.distributed import (
        destroy_distributed_environment,
        destroy_model_parallel,
        init_distributed_environment,
        initialize_model_parallel,
    )
    from vllm.utils.network_utils import get_open_port

    with set_current_vllm_config(VllmConfig(device_config=DeviceConfig("cpu"))):
        init_distributed_environment(
            world_size=1,
            rank=0,
            distributed_init_method=f"tcp://127.0.0.1:{get_open_port()}",
            local_rank=0,
            backend="gloo",
        )
        initialize_model_parallel(1, 1)
    yield
    destroy_model_parallel()
    destroy_distributed_environment()


@pytest.fixture
def moe_env(dist_env, rocm_sim, aiter_env, cpu_vllm_config):
    aiter_env.set("VLLM_ROCM_USE_AITER_MOE", "1")
    aiter_env.set("VLLM_ROCM_USE_AITER_FUSION_SHARED_EXPERTS", "0")
    cpu_vllm_config.model_config = SimpleNamespace(dtype=torch.bfloat16)
    return cpu_vllm_config


def make_moe(vllm_config):
    from vllm.model_executor.models.deepseek_v2 import DeepseekV2MoE

    config = SimpleNamespace(
        hidden_size=HIDDEN,
        hidden_act="silu",
        n_routed_experts=NUM_EXPERTS,
        n_shared_experts=None,
        moe_intermediate_size=16,
        num_experts_per_tok=TOP_K,
        norm_topk_prob=True,
        n_group=1,
        topk_group=1,
        topk_method="noaux_tc",
        scoring_func="sigmoid",
        routed_scaling_factor=1.0,
    )
    torch.set_default_dtype(torch.bfloat16)
    try:
        moe = DeepseekV2MoE(config, vllm_config.parallel_config, prefix="layers.0.mlp")
    finally:
        torch.set_default_dtype(torch.float32)
    return moe.to("cuda")


def load_router(moe, gate_weight: torch.Tensor, bias: torch.Tensor) -> None:
    """What load_weights() does for the router parameters, then the post-load step."""
    import vllm.model_executor.models.deepseek_v2 as deepseek_v2
    from vllm.model_executor.model_loader.weight_utils import default_weight_loader

    for param, weight in (
        (moe.gate.weight, gate_weight),
        (moe.gate.e_score_correction_bias, bias),
    ):
        getattr(param, "weight_loader", default_weight_loader)(param, weight)
    finalize = getattr(deepseek_v2, "select_moe_router_dtypes", None)
    if finalize is not None:
        finalize(moe)


class Model(torch.nn.Module):
    """Stands for DeepseekV2ForCausalLM around its MoE layer's router."""

    def __init__(self, moe) -> None:
        super().__init__()
        self.moe = moe
        import vllm.model_executor.models.deepseek_v2 as deepseek_v2

        fix = getattr(deepseek_v2, "fix_moe_router_dtypes_on_first_forward", None)
        if fix is not None:
            fix(self)

    def forward(self, logits: torch.Tensor, weights, ids) -> None:
        from vllm._aiter_ops import rocm_aiter_ops

        gate = self.moe.gate
        rocm_aiter_ops.biased_grouped_topk(
            logits.to(gate.out_dtype), gate.e_score_correction_bias, weights, ids, 1, 1, True
        )


def logits_case() -> torch.Tensor:
    """Experts 2, 5 and 9 score alike for every token: the bias decides."""
    logits = torch.full((TOKENS, NUM_EXPERTS), -4.0, device="cuda")
    logits[:, [2, 5, 9]] = 0.5
    return logits


def reference_route(logits: torch.Tensor, bias: torch.Tensor) -> list:
    choice = logits.float().cpu().sigmoid() + bias.float().cpu()
    return choice.topk(TOP_K, dim=-1).indices.sort(dim=-1).values.tolist()


def captured(model: Model, logits: torch.Tensor):
    weights = torch.empty(TOKENS, TOP_K, dtype=torch.float32, device="cuda")
    ids = torch.empty(TOKENS, TOP_K, dtype=torch.int32, device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        model(logits, weights, ids)  # the first forward fixes the router dtype
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        model(logits, weights, ids)

    def replay() -> list:
        graph.replay()
        torch.cuda.synchronize()
        return ids.sort(dim=-1).values.tolist()

    return replay


def test_reload_in_place_reaches_the_replay(moe_env):
    first, second = FIRST.float(), FIRST.flip(0).float()
    logits = logits_case()
    moe = make_moe(moe_env)
    model = Model(moe)
    load_router(moe, torch.randn(NUM_EXPERTS, HIDDEN).bfloat16(), first)
    assert moe.gate.out_dtype == torch.bfloat16
    replay = captured(model, logits)
    # Held, as the captured graph holds its address: a new allocation cannot
    # reuse the address and pass for the old storage.
    bias = moe.gate.e_score_correction_bias.data
    pointer = bias.data_ptr()
    assert replay() == reference_route(logits, first)

    load_router(moe, torch.randn(NUM_EXPERTS, HIDDEN).bfloat16(), second)
    assert reference_route(logits, second) != reference_route(logits, first)
    assert moe.gate.e_score_correction_bias.data_ptr() == pointer
    assert replay() == reference_route(logits, second)


def test_streaming_update_reaches_the_replay(moe_env):
    reload = pytest.importorskip("vllm.model_executor.model_loader.reload")
    import vllm.model_executor.models.deepseek_v2 as deepseek_v2
    from vllm.model_executor.model_loader.weight_utils import default_weight_loader

    first, second = FIRST.float(), FIRST.flip(0).float()
    logits = logits_case()
    moe = make_moe(moe_env)
    model = Model(moe)
    reload.record_metadata_for_reloading(model)
    load_router(moe, torch.randn(NUM_EXPERTS, HIDDEN).bfloat16(), first)
    replay = captured(model, logits)
    held = moe.gate.e_score_correction_bias.data, moe.gate.weight.data  # see above
    pointers = tuple(t.data_ptr() for t in held)
    assert replay() == reference_route(logits, first)

    gate_weight = torch.randn(NUM_EXPERTS, HIDDEN).bfloat16()
    reload.initialize_layerwise_reload(model)
    # One chunk per parameter, each followed by the post-load step.
    for param, weight in (
        (moe.gate.e_score_correction_bias, second),
        (moe.gate.weight, gate_weight),
    ):
        getattr(param, "weight_loader", default_weight_loader)(param, weight)
        deepseek_v2.select_moe_router_dtypes(model)
    reload.finalize_layerwise_reload(model, moe_env.model_config)

    assert (moe.gate.e_score_correction_bias.data_ptr(), moe.gate.weight.data_ptr()) == pointers
    assert torch.equal(moe.gate.weight.data.cpu(), gate_weight)
    assert replay() == reference_route(logits, second)
