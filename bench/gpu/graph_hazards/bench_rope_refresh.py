# SPDX-License-Identifier: Apache-2.0
"""Time one decode step of compiled rotary layers on the AITER path (ROCm
simulation on a CUDA GPU), replayed from a captured CUDA graph, and check
that the replay reads an in-place write into the cache.

Run it in a bundle's tree, or in a tree without a patch (the bundle's
``without/NN`` copies under run_bundle's work directory), to compare:
a tree without the bf16 copy casts the whole cache per layer; one with the
copy but without the row refresh reads it as it is (and misses the write);
one with the refresh converts the step's rows first.

    PYTHONPATH=TREE:BUNDLE/gpu:BUNDLE/sim:BUNDLE/meta python3 bench_rope_refresh.py

Prints one JSON line per token count: microseconds per replay (median of
``--repeat`` timed batches of ``--iters`` replays) and whether the replay
after an in-place write into every cache matched vLLM's native path.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

os.environ.setdefault("VLLM_ROCM_USE_AITER", "1")
os.environ.setdefault("VLLM_ROCM_USE_AITER_TRITON_ROPE", "1")

import vllm_rocm_sim.plugin  # noqa: E402,F401  (activates the simulation)
from fork_gpu import _no_cuda_platform_under_the_sim  # noqa: E402

_no_cuda_platform_under_the_sim()

import torch  # noqa: E402
from torch import nn  # noqa: E402

HEAD_SIZE = 64
NUM_HEADS = 64
NUM_KV_HEADS = 8
MAX_POSITIONS = 131072  # GPT-OSS: a float32 cache of 131072 x 64


def layers(n: int) -> nn.Module:
    from vllm.config import (
        CompilationConfig,
        DeviceConfig,
        VllmConfig,
        set_current_vllm_config,
    )
    from vllm.model_executor.layers.rotary_embedding import RotaryEmbedding

    config = VllmConfig(
        device_config=DeviceConfig(device="cuda"),
        compilation_config=CompilationConfig(custom_ops=["none", "+rotary_embedding"]),
    )
    with set_current_vllm_config(config):
        ropes = [
            RotaryEmbedding(HEAD_SIZE, HEAD_SIZE, MAX_POSITIONS, 150000.0, True, torch.float32)
            for _ in range(n)
        ]
    assert all(r.use_aiter for r in ropes)

    class Stack(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleList(ropes)

        def forward(self, positions, query, key):
            for layer in self.layers:
                query, key = layer(positions, query, key)
            return query, key

    return Stack().cuda()


def native(model: nn.Module, positions, query, key):
    for layer in model.layers:
        query, key = layer.forward_native(
            positions, query.float(), key.float()
        )  # float32 queries read the float32 cache
    return query, key


def run(tokens: int, n_layers: int, iters: int, repeat: int) -> dict:
    torch.manual_seed(0)
    model = layers(n_layers)
    compiled = torch.compile(model, fullgraph=True)
    positions = torch.randint(0, MAX_POSITIONS, (tokens,), device="cuda")
    query = torch.randn(tokens, NUM_HEADS * HEAD_SIZE, device="cuda").bfloat16()
    key = torch.randn(tokens, NUM_KV_HEADS * HEAD_SIZE, device="cuda").bfloat16()
    q_in, k_in = query.clone(), key.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            compiled(positions, q_in.clone(), k_in.clone())
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        q_out, k_out = compiled(positions, q_in, k_in)
    times = []
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(repeat):
        start.record()
        for _ in range(iters):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1000 / iters)
    # An in-place write into every cache, then one replay on fresh inputs.
    for layer in model.layers:
        layer.base = 500.0
        layer.cos_sin_cache.copy_(layer._compute_cos_sin_cache().cuda())
    q_in.copy_(query)
    k_in.copy_(key)
    graph.replay()
    torch.cuda.synchronize()
    ref_q, ref_k = native(model, positions, query, key)
    fresh = torch.allclose(q_out.float(), ref_q, atol=3e-2 * n_layers, rtol=3e-2) and (
        torch.allclose(k_out.float(), ref_k, atol=3e-2 * n_layers, rtol=3e-2)
    )
    return {
        "tokens": tokens,
        "layers": n_layers,
        "us_per_replay": round(statistics.median(times), 2),
        "us_min": round(min(times), 2),
        "replay_after_in_place_write_matches": bool(fresh),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 64, 256])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--label", default="")
    args = parser.parse_args()
    for tokens in args.tokens:
        torch._dynamo.reset()
        row = run(tokens, args.layers, args.iters, args.repeat)
        print(json.dumps({"label": args.label, **row}), flush=True)


if __name__ == "__main__":
    main()
