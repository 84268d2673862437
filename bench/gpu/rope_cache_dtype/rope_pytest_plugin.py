"""Pytest plugin: run the fork tree's rotary cache tests against one build.

The tests call ``torch.ops._C.rotary_embedding`` after ``from vllm import
_custom_ops`` (which loads vLLM's extension). Without a vLLM install, this
plugin stands in for both: it registers ``_C::rotary_embedding`` with vLLM's
schema, forwarding to the build named by ROPE_BENCH_VARIANT, and provides an
empty ``vllm._custom_ops`` module. Load with ``-p rope_pytest_plugin``.

Environment: ROPE_BENCH_VARIANT (one of rope_ext.VARIANTS), ROPE_BENCH_SRC
and ROPE_BENCH_BUILD (as given to bench.py).
"""

from __future__ import annotations

import os
import sys
import types
from pathlib import Path

import rope_ext
import torch

_variant = os.environ["ROPE_BENCH_VARIANT"]
_op = rope_ext.load(
    _variant,
    Path(os.environ["ROPE_BENCH_SRC"]),
    Path(os.environ["ROPE_BENCH_BUILD"]),
)

if "vllm" in sys.modules or hasattr(torch.ops._C, "rotary_embedding"):
    raise RuntimeError("a real vLLM is loaded; this plugin would shadow it")


def _rotary_embedding(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor | None,
    head_size: int,
    cos_sin_cache: torch.Tensor,
    is_neox: bool,
    rope_dim_offset: int = 0,
    inverse: bool = False,
) -> None:
    _op(
        positions,
        query,
        key,
        head_size,
        cos_sin_cache,
        is_neox,
        rope_dim_offset,
        inverse,
    )


_lib = torch.library.Library("_C", "DEF")
_lib.define(
    "rotary_embedding(Tensor positions, Tensor! query, Tensor!? key, "
    "int head_size, Tensor cos_sin_cache, bool is_neox, "
    "int rope_dim_offset=0, bool inverse=False) -> ()"
)
_lib.impl("rotary_embedding", _rotary_embedding, "CUDA")

_vllm = types.ModuleType("vllm")
_custom_ops = types.ModuleType("vllm._custom_ops")
_vllm._custom_ops = _custom_ops  # type: ignore[attr-defined]
sys.modules["vllm"] = _vllm
sys.modules["vllm._custom_ops"] = _custom_ops


def pytest_report_header(config) -> str:
    return f"torch.ops._C.rotary_embedding -> {rope_ext.namespace(_variant)}"
