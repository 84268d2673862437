# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Reference rotary embedding of the fake ``aiter`` (in place, float32 math)."""

import torch

from ...._sim import recorded

_NEOX = 0  # rotate_style: 0 = NeoX halves, 1 = GPT-J interleaved pairs


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rotate_style: int) -> None:
    # x: [tokens, heads, rot_dim]; cos/sin: [tokens, rot_dim // 2]
    xf = x.float()
    c = cos.float().unsqueeze(1)
    s = sin.float().unsqueeze(1)
    if rotate_style == _NEOX:
        x1, x2 = xf.chunk(2, dim=-1)
        out = torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)
    else:
        x1, x2 = xf[..., 0::2], xf[..., 1::2]
        out = torch.stack((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).flatten(-2)
    x.copy_(out.to(x.dtype))


@recorded
def rope_cached_thd_positions_offsets_2c_fwd_inplace(
    x: torch.Tensor,
    y: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    positions: torch.Tensor,
    offsets: torch.Tensor | None,
    rotate_style: int,
    reuse_freqs_front_part: bool,
    nope_first: bool,
    transpose_output: bool = False,
) -> None:
    """Rotates x [T, Hq, D] and y [T, Hk, D] in place by the cached cos/sin
    rows [max_pos, D // 2] at positions (+ offsets)."""
    if not reuse_freqs_front_part or nope_first or transpose_output:
        raise NotImplementedError("simulated rope: only reuse_freqs_front_part")
    pos = positions.long()
    if offsets is not None:
        pos = pos + offsets.long()
    c, s = cos[pos], sin[pos]
    _rotate(x, c, s, rotate_style)
    _rotate(y, c, s, rotate_style)
