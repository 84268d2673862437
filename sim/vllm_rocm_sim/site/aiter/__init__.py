# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Fake ``aiter`` for the ROCm simulation (see ``vllm_rocm_sim``).

Functions take the arguments vLLM passes to the real AITER and compute
reference results with plain torch ops, in float32, on any device. They
mirror the documented semantics, not the numerics of the AITER kernels.
Every call is logged in ``vllm_rocm_sim.recorder.RECORDER`` as
``aiter.<name>``. A test can replace any function with
``monkeypatch.setattr(aiter, "<name>", fn)``: vLLM imports them from
``aiter`` at call time.
"""

from enum import IntEnum

import torch

from . import dtypes
from ._sim import recorded

__version__ = "0.0.0+rocmsim"


class ActivationType(IntEnum):
    No = -1
    Silu = 0
    Gelu = 1
    Swiglu = 2


class QuantType(IntEnum):
    No = 0
    per_Tensor = 1
    per_Token = 2
    per_1x32 = 3
    per_1x128 = 4
    per_128x128 = 5


def _check_same_dtype(name: str, tensor: torch.Tensor, ref: torch.Tensor) -> None:
    # The kernels read these operands with the element type of the
    # reference operand: a mismatch is a hard error there, so it is here.
    if tensor.dtype != ref.dtype:
        raise TypeError(
            f"aiter: {name} dtype {tensor.dtype} must match gating_output dtype {ref.dtype}"
        )


def _grouped_select(
    scores: torch.Tensor,
    choice: torch.Tensor,
    group_scores: torch.Tensor,
    topk: int,
    topk_group: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    num_tokens, num_experts = choice.shape
    num_groups = group_scores.shape[-1]
    group_idx = torch.topk(group_scores, k=topk_group, dim=-1).indices
    group_mask = torch.zeros_like(group_scores, dtype=torch.bool)
    group_mask.scatter_(1, group_idx, True)
    expert_mask = group_mask.repeat_interleave(num_experts // num_groups, dim=-1)
    masked = choice.masked_fill(~expert_mask, float("-inf"))
    ids = torch.topk(masked, k=topk, dim=-1).indices
    return scores.gather(1, ids), ids


def _write_topk(
    weights: torch.Tensor,
    ids: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    need_renorm: bool,
    routed_scaling_factor: float,
) -> None:
    if need_renorm:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    weights = weights * routed_scaling_factor
    topk_weights.copy_(weights.to(topk_weights.dtype))
    topk_ids.copy_(ids.to(topk_ids.dtype))


# The group counts AITER's HIP grouped top-k kernels are instantiated for
# (the NUM_GRP switch of csrc/kernels/topk_softmax_kernels_group.cu, the same
# from v0.1.10 to the main line of August 2026); any other count fails there
# with this message.
_KERNEL_GROUP_COUNTS = (1, 2, 4, 8)


def _check_group_count(num_expert_group: int) -> None:
    if num_expert_group not in _KERNEL_GROUP_COUNTS:
        raise RuntimeError(f"Unsupported num_expert_group: {num_expert_group}")


@recorded
def biased_grouped_topk(
    gating_output: torch.Tensor,
    correction_bias: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    num_expert_group: int,
    topk_group: int,
    need_renorm: bool,
    routed_scaling_factor: float = 1.0,
) -> None:
    """DeepSeek-V3 routing: sigmoid scores, experts chosen on score + bias
    within the ``topk_group`` groups whose two best biased scores sum
    highest; weights are the unbiased scores. Writes topk_weights/ids.
    Like the HIP kernel, only for a group count in _KERNEL_GROUP_COUNTS
    (AITER's large-batch moe_fused_gate path is not modelled)."""
    _check_group_count(num_expert_group)
    _check_same_dtype("correction_bias", correction_bias, gating_output)
    scores = gating_output.float().sigmoid()
    choice = scores + correction_bias.float().unsqueeze(0)
    num_tokens, num_experts = choice.shape
    grouped = choice.view(num_tokens, num_expert_group, -1)
    per_group = min(2, grouped.shape[-1])
    group_scores = grouped.topk(per_group, dim=-1).values.sum(dim=-1)
    weights, ids = _grouped_select(scores, choice, group_scores, topk_ids.shape[-1], topk_group)
    _write_topk(weights, ids, topk_weights, topk_ids, need_renorm, routed_scaling_factor)


@recorded
def grouped_topk(
    gating_output: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    num_expert_group: int,
    topk_group: int,
    need_renorm: bool,
    is_softmax: bool = True,
    routed_scaling_factor: float = 1.0,
) -> None:
    """Group-limited top-k without bias; a group scores its best expert."""
    logits = gating_output.float()
    scores = logits.softmax(dim=-1) if is_softmax else logits.sigmoid()
    num_tokens = scores.shape[0]
    group_scores = scores.view(num_tokens, num_expert_group, -1).amax(dim=-1)
    weights, ids = _grouped_select(scores, scores, group_scores, topk_ids.shape[-1], topk_group)
    _write_topk(weights, ids, topk_weights, topk_ids, need_renorm, routed_scaling_factor)


@recorded
def topk_softmax(
    topk_weights: torch.Tensor,
    topk_indices: torch.Tensor,
    token_expert_indices: torch.Tensor,
    gating_output: torch.Tensor,
    need_renorm: bool,
    num_shared_experts: int = 0,
    shared_expert_scoring_func: str = "",
) -> None:
    if num_shared_experts:
        raise NotImplementedError("simulated topk_softmax: no fused shared experts")
    scores = gating_output.float().softmax(dim=-1)
    weights, ids = torch.topk(scores, k=topk_indices.shape[-1], dim=-1)
    _write_topk(weights, ids, topk_weights, topk_indices, need_renorm, 1.0)
    num_tokens, topk = ids.shape
    rows = torch.arange(topk, device=ids.device) * num_tokens
    token_expert_indices.copy_(
        (rows.unsqueeze(0) + torch.arange(num_tokens, device=ids.device)[:, None]).to(
            token_expert_indices.dtype
        )
    )


@recorded
def topk_sigmoid(
    topk_weights: torch.Tensor,
    topk_indices: torch.Tensor,
    gating_output: torch.Tensor,
) -> None:
    scores = gating_output.float().sigmoid()
    weights, ids = torch.topk(scores, k=topk_indices.shape[-1], dim=-1)
    _write_topk(weights, ids, topk_weights, topk_indices, False, 1.0)


def _rms(
    x: torch.Tensor, weight: torch.Tensor, eps: float, gemma_norm: bool = False
) -> torch.Tensor:
    xf = x.float()
    out = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)
    w = weight.float() + 1 if gemma_norm else weight.float()
    return (out * w).to(x.dtype)


def _model_sensitive(flag: int) -> None:
    if flag:
        raise NotImplementedError("simulated rmsnorm: use_model_sensitive_rmsnorm not modelled")


@recorded
def rms_norm(
    input: torch.Tensor, weight: torch.Tensor, epsilon: float, use_model_sensitive_rmsnorm: int = 0
) -> torch.Tensor:
    _model_sensitive(use_model_sensitive_rmsnorm)
    return _rms(input, weight, epsilon)


@recorded
def rmsnorm2d_fwd(
    input: torch.Tensor, weight: torch.Tensor, epsilon: float, use_model_sensitive_rmsnorm: int = 0
) -> torch.Tensor:
    _model_sensitive(use_model_sensitive_rmsnorm)
    return _rms(input, weight, epsilon)


@recorded
def rmsnorm2d_fwd_with_add(
    out: torch.Tensor,
    input: torch.Tensor,
    residual_in: torch.Tensor,
    residual_out: torch.Tensor,
    weight: torch.Tensor,
    epsilon: float,
    gemma_norm: bool = False,
    use_model_sensitive_rmsnorm: int = 0,
) -> None:
    _model_sensitive(use_model_sensitive_rmsnorm)
    added = (input.float() + residual_in.float()).to(residual_in.dtype)
    residual_out.copy_(added)
    out.copy_(_rms(added, weight, epsilon, gemma_norm))


_MLA_METADATA_DTYPE = torch.int32


@recorded
def get_mla_metadata_info_v1(
    batch_size: int,
    max_seqlen_qo: int,
    num_head_qo: int,
    q_dtype: torch.dtype,
    kv_dtype: torch.dtype,
    is_sparse: bool,
    fast_mode: bool = True,
    num_kv_splits: int = 32,
    intra_batch_mode: bool = False,
    max_split_per_batch: int = -1,
    **kwargs,
) -> tuple[tuple[tuple[int, ...], torch.dtype], ...]:
    """Sizes and dtypes of the six work buffers, in the order
    (work_meta_data, work_indptr, work_info_set, reduce_indptr,
    reduce_final_map, reduce_partial_map). Simulated sizes are small."""
    batch = batch_size * max_seqlen_qo
    dt = _MLA_METADATA_DTYPE
    return (
        ((2,), dt),
        ((batch + 1,), dt),
        ((batch, 8), dt),
        ((batch + 1,), dt),
        ((batch, 2), dt),
        ((batch,), dt),
    )


def mla_metadata_fingerprint(*tensors: torch.Tensor) -> int:
    """Deterministic integer summary of the inputs of get_mla_metadata_v1."""
    total = 0
    for i, t in enumerate(tensors):
        flat = t.detach().reshape(-1).to("cpu", torch.int64)
        weights = torch.arange(1, flat.numel() + 1, dtype=torch.int64)
        total = total * 1_000_003 + i + int((flat * weights).sum())
        total %= 2**31 - 1
    return total


@recorded
def get_mla_metadata_v1(
    seqlens_qo_indptr: torch.Tensor,
    seqlens_kv_indptr: torch.Tensor,
    kv_last_page_lens: torch.Tensor,
    num_heads_per_head_k: int,
    num_heads_k: int,
    is_causal: bool,
    work_metadata_ptrs: torch.Tensor,
    work_info_set: torch.Tensor,
    work_indptr: torch.Tensor,
    reduce_indptr: torch.Tensor,
    reduce_final_map: torch.Tensor,
    reduce_partial_map: torch.Tensor,
    **kwargs,
) -> None:
    """Fills every output buffer with ``fingerprint + position`` where the
    fingerprint is mla_metadata_fingerprint(qo_indptr, kv_indptr,
    kv_last_page_lens): outputs tell which inputs they were built from."""
    fp = mla_metadata_fingerprint(seqlens_qo_indptr, seqlens_kv_indptr, kv_last_page_lens)
    for out in (
        work_metadata_ptrs,
        work_info_set,
        work_indptr,
        reduce_indptr,
        reduce_final_map,
        reduce_partial_map,
    ):
        pos = torch.arange(out.numel(), dtype=torch.int64, device=out.device)
        out.copy_(((pos + fp) % (2**31 - 1)).view(out.shape).to(out.dtype))


__all__ = [
    "ActivationType",
    "QuantType",
    "biased_grouped_topk",
    "dtypes",
    "get_mla_metadata_info_v1",
    "get_mla_metadata_v1",
    "grouped_topk",
    "mla_metadata_fingerprint",
    "rms_norm",
    "rmsnorm2d_fwd",
    "rmsnorm2d_fwd_with_add",
    "topk_sigmoid",
    "topk_softmax",
]
