# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Reference MoE routing and unquantized fused MoE of the fake ``aiter``."""

import torch
import torch.nn.functional as F

from . import ActivationType, QuantType, _write_topk
from ._sim import recorded


@recorded
def fused_topk(
    hidden_states: torch.Tensor,
    gating_output: torch.Tensor,
    topk: int,
    renormalize: bool,
    topk_ids: torch.Tensor | None = None,
    topk_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    num_tokens = gating_output.shape[0]
    device = gating_output.device
    if topk_weights is None:
        topk_weights = torch.empty(num_tokens, topk, dtype=torch.float32, device=device)
    if topk_ids is None:
        topk_ids = torch.empty(num_tokens, topk, dtype=torch.int32, device=device)
    scores = gating_output.float().softmax(dim=-1)
    weights, ids = torch.topk(scores, k=topk, dim=-1)
    _write_topk(weights, ids, topk_weights, topk_ids, renormalize, 1.0)
    return topk_weights, topk_ids


_ACTIVATIONS = {ActivationType.Silu: F.silu, ActivationType.Gelu: F.gelu}


@recorded
def fused_moe(
    hidden_states: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    topk_weight: torch.Tensor,
    topk_ids: torch.Tensor,
    expert_mask: torch.Tensor | None = None,
    activation: ActivationType = ActivationType.Silu,
    quant_type: QuantType = QuantType.No,
    doweight_stage1: bool = False,
    w1_scale: torch.Tensor | None = None,
    w2_scale: torch.Tensor | None = None,
    a1_scale: torch.Tensor | None = None,
    a2_scale: torch.Tensor | None = None,
    num_local_tokens: torch.Tensor | None = None,
    dtype: torch.dtype | None = None,
    hidden_pad: int = 0,
    intermediate_pad: int = 0,
    bias1: torch.Tensor | None = None,
    bias2: torch.Tensor | None = None,
) -> torch.Tensor:
    """Unquantized reference: w1 [E, 2I, H] (gate rows, then up rows),
    w2 [E, H, I]; expert_mask [global E] marks the local experts."""
    if quant_type != QuantType.No or activation not in _ACTIVATIONS:
        raise NotImplementedError(
            f"simulated fused_moe: {quant_type!r}/{activation!r} not modelled"
        )
    act = _ACTIVATIONS[activation]
    ids = topk_ids.long()
    if expert_mask is not None:
        local_id = torch.cumsum(expert_mask.long(), dim=0) - 1
        is_local = expert_mask.bool()[ids]
        ids = torch.where(is_local, local_id[ids], -1)
    x = hidden_states.float()
    out = torch.zeros_like(x)
    inter = w2.shape[-1]
    for slot in range(ids.shape[1]):
        for expert in ids[:, slot].unique().tolist():
            if expert < 0:
                continue
            rows = ids[:, slot] == expert
            weight = topk_weight[rows, slot].float().unsqueeze(-1)
            inp = x[rows] * weight if doweight_stage1 else x[rows]
            h = inp @ w1[expert].float().t()
            if bias1 is not None:
                h = h + bias1[expert].float()
            h = act(h[:, :inter]) * h[:, inter:]
            y = h @ w2[expert].float().t()
            if bias2 is not None:
                y = y + bias2[expert].float()
            out[rows] += y if doweight_stage1 else y * weight
    return out.to(dtype or hidden_states.dtype)
