# SPDX-License-Identifier: Apache-2.0
"""The bf16 copy of a float32 rotary cache under torch.compile with
Inductor on CUDA (Triton code, not the C++ of a CPU run), on the AITER path
of the ROCm simulation: the compiled graph holds no cast of the cache, and
the compiled call gives the right result after ``module.to(...)``, after a
subclass registers a recomputed cache, and after an in-place update of the
cache with no eager call after it, also in the replay of a captured CUDA graph.

``pytest -p vllm_rocm_sim.plugin -p fork_gpu`` in a vLLM tree.
"""

import pytest
import torch

FORK_PATCHES = (
    "Keep a bf16 copy of a non-bf16 rotary cache",
    "Only return the bf16 rotary cache copy while it matches",
    "Refresh the rows of the bf16 rotary cache copy a compiled graph reads",
)

pytestmark = pytest.mark.gpu

HEAD_SIZE = 64
NUM_HEADS = 4
NUM_KV_HEADS = 1
MAX_POSITIONS = 512
TOKENS = 33


@pytest.fixture
def aiter_rope(aiter_env):
    from vllm._aiter_ops import rocm_aiter_ops

    aiter_env.set("VLLM_ROCM_USE_AITER_TRITON_ROPE", "1")
    assert rocm_aiter_ops.is_triton_rotary_embed_enabled()


def _rope():
    from vllm.config import CompilationConfig, DeviceConfig, VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.rotary_embedding import RotaryEmbedding

    config = VllmConfig(
        device_config=DeviceConfig(device="cuda"),
        compilation_config=CompilationConfig(custom_ops=["none", "+rotary_embedding"]),
    )
    with set_current_vllm_config(config):
        rope = RotaryEmbedding(HEAD_SIZE, HEAD_SIZE, MAX_POSITIONS, 10000.0, True, torch.float32)
    assert rope.use_aiter
    return rope.to("cuda")


def _inputs(seed: int = 0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    positions = torch.randint(0, MAX_POSITIONS, (TOKENS,), generator=gen, device="cuda")
    query = torch.randn(TOKENS, NUM_HEADS * HEAD_SIZE, generator=gen, device="cuda")
    key = torch.randn(TOKENS, NUM_KV_HEADS * HEAD_SIZE, generator=gen, device="cuda")
    return positions, query.bfloat16(), key.bfloat16()


class Compiled:
    """torch.compile with Inductor, keeping dynamo's graphs to inspect."""

    def __init__(self, module) -> None:
        from torch._inductor.compile_fx import compile_fx

        self.graphs = []

        def backend(gm, example_inputs):
            self.graphs.append(gm)
            return compile_fx(gm, example_inputs)

        torch._dynamo.reset()
        self.fn = torch.compile(module, backend=backend, fullgraph=True)

    def __call__(self, positions, query, key):
        return self.fn(positions, query.clone(), key.clone())

    def cache_casts(self) -> int:
        """Casts of the whole float32 cache in the graphs (a cast of the rows
        a step reads, tokens x rotary_dim, is not one)."""
        casts = 0
        for gm in self.graphs:
            for node in gm.graph.nodes:
                if node.op not in ("call_method", "call_function"):
                    continue
                name = getattr(node.target, "__name__", str(node.target))
                if name not in ("to", "type", "_to_copy", "bfloat16"):
                    continue
                source = node.args[0] if node.args else None
                val = getattr(source, "meta", {}).get("example_value")
                if (
                    val is not None
                    and val.dtype == torch.float32
                    and tuple(val.shape) == (MAX_POSITIONS, HEAD_SIZE)
                ):
                    casts += 1
        return casts


def expected(rope, positions, query, key):
    """vLLM's native rotary path with the cache as it is now, cast to bf16."""
    cache = rope.cos_sin_cache.to(torch.bfloat16)
    saved = rope.cos_sin_cache
    try:
        rope.cos_sin_cache = cache
        return rope.forward_native(positions, query.clone(), key.clone())
    finally:
        rope.cos_sin_cache = saved


def check(rope, compiled, seed=0):
    args = _inputs(seed)
    q, k = compiled(*args)
    ref_q, ref_k = expected(rope, *args)
    torch.testing.assert_close(q, ref_q, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(k, ref_k, atol=2e-2, rtol=2e-2)


def test_no_cast_of_the_cache_in_the_compiled_graph(aiter_rope):
    rope = _rope()
    compiled = Compiled(rope)
    check(rope, compiled)
    assert compiled.graphs, "nothing was compiled"
    assert compiled.cache_casts() == 0


def test_after_module_to(aiter_rope):
    rope = _rope()
    rope.to(torch.float16)  # converts the cache and its copy
    assert rope.cos_sin_cache.dtype == torch.float16
    compiled = Compiled(rope)
    check(rope, compiled)


def test_after_a_subclass_registers_a_recomputed_cache(aiter_rope):
    rope = _rope()
    compiled = Compiled(rope)
    check(rope, compiled)
    rope.base = 500.0
    cache = rope._compute_cos_sin_cache().to(torch.float32).to("cuda")
    rope.register_buffer("cos_sin_cache", cache, persistent=False)
    check(rope, compiled, seed=1)


def test_after_an_in_place_update_of_the_cache(aiter_rope):
    """A weight sync or a subclass writes new values into the cache in place
    and calls nothing else. The next eager call (vLLM's warm-up or an eager
    step) refreshes the copy in place: the compiled call, which reads the
    copy's storage as a captured graph does, then uses the new values."""
    rope = _rope()
    compiled = Compiled(rope)
    check(rope, compiled)
    address = rope.cos_sin_cache_bf16.data_ptr()
    rope.base = 500.0
    rope.cos_sin_cache.copy_(rope._compute_cos_sin_cache().to("cuda"))
    positions, query, key = _inputs(2)
    rope.forward_hip(positions, query.float(), key.float())  # eager, float32 as the cache
    assert rope.cos_sin_cache_bf16.data_ptr() == address
    check(rope, compiled, seed=1)


def test_in_place_update_with_no_eager_call_between(aiter_rope):
    """A write into the cache in place and nothing else: the next compiled
    call must read the new values (no eager call refreshes the copy)."""
    rope = _rope()
    compiled = Compiled(rope)
    check(rope, compiled)
    rope.base = 500.0
    rope.cos_sin_cache.copy_(rope._compute_cos_sin_cache().to("cuda"))
    check(rope, compiled, seed=1)


def test_in_place_update_reaches_a_captured_graph(aiter_rope):
    """The compiled call captured in a CUDA graph; the cache written in
    place; the replay, which runs no Python, reads the new values."""
    rope = _rope()
    compiled = Compiled(rope)
    positions, query, key = _inputs(0)
    static = (positions.clone(), query.clone(), key.clone())
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):  # compile and warm up outside the capture
            compiled.fn(static[0], static[1].clone(), static[2].clone())
    torch.cuda.current_stream().wait_stream(stream)
    q_in, k_in = static[1].clone(), static[2].clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        q_out, k_out = compiled.fn(static[0], q_in, k_in)

    new_positions, new_query, new_key = _inputs(3)
    rope.base = 500.0
    rope.cos_sin_cache.copy_(rope._compute_cos_sin_cache().to("cuda"))
    static[0].copy_(new_positions)
    q_in.copy_(new_query)
    k_in.copy_(new_key)
    graph.replay()
    torch.cuda.synchronize()
    ref_q, ref_k = expected(rope, new_positions, new_query, new_key)
    torch.testing.assert_close(q_out, ref_q, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(k_out, ref_k, atol=2e-2, rtol=2e-2)
