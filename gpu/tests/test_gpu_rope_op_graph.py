# SPDX-License-Identifier: Apache-2.0
"""vLLM's rotary op (``torch.ops._C.rotary_embedding``, the tree's own
kernel built for this GPU) inside a captured CUDA graph: the graph is
replayed with new positions, queries and keys written into its input
buffers and must give what vLLM's native PyTorch path gives for them.

Needs ``-p fork_gpu`` with ``FORK_GPU_KERNEL`` set (not the ROCm simulation).
"""

import pytest
import torch

FORK_PATCHES = ("Vectorize the rotary embedding kernel",)

pytestmark = pytest.mark.gpu

HEAD_SIZE = 128
NUM_HEADS = 8
NUM_KV_HEADS = 2
MAX_POSITIONS = 4096


def _rope(rotary_dim: int, is_neox: bool, cache_dtype: torch.dtype):
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.rotary_embedding import RotaryEmbedding

    with set_current_vllm_config(VllmConfig()):
        rope = RotaryEmbedding(HEAD_SIZE, rotary_dim, MAX_POSITIONS, 10000.0, is_neox, cache_dtype)
    return rope.to("cuda")


@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("rotary_dim", [HEAD_SIZE, 64])
@pytest.mark.parametrize(
    "dtype,cache_dtype",
    [(torch.bfloat16, torch.bfloat16), (torch.float16, torch.float16), (torch.float32,) * 2],
)
def test_rope_op_replays_with_new_positions(is_neox, rotary_dim, dtype, cache_dtype):
    if not hasattr(torch.ops._C, "rotary_embedding"):
        pytest.fail("torch.ops._C.rotary_embedding is not registered (FORK_GPU_KERNEL unset?)")
    rope = _rope(rotary_dim, is_neox, cache_dtype)
    tokens = 61
    gen = torch.Generator(device="cuda").manual_seed(0)
    positions = torch.zeros(tokens, dtype=torch.int64, device="cuda")
    query = torch.zeros(tokens, NUM_HEADS * HEAD_SIZE, dtype=dtype, device="cuda")
    key = torch.zeros(tokens, NUM_KV_HEADS * HEAD_SIZE, dtype=dtype, device="cuda")

    # Warm up on a side stream, then capture the op on the static buffers.
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        rope.forward_cuda(positions, query, key)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        rope.forward_cuda(positions, query, key)

    for step in range(4):
        new_pos = torch.randint(0, MAX_POSITIONS, (tokens,), generator=gen, device="cuda")
        if step == 3:
            new_pos[:] = MAX_POSITIONS - 1 - step  # one position for every token
        new_q = torch.randn(query.shape, generator=gen, device="cuda").to(dtype)
        new_k = torch.randn(key.shape, generator=gen, device="cuda").to(dtype)
        positions.copy_(new_pos)
        query.copy_(new_q)
        key.copy_(new_k)
        graph.replay()
        ref_q, ref_k = rope.forward_native(new_pos, new_q.clone(), new_k.clone())
        tol = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}[dtype]
        torch.testing.assert_close(query, ref_q, atol=tol, rtol=tol)
        torch.testing.assert_close(key, ref_k, atol=tol, rtol=tol)
