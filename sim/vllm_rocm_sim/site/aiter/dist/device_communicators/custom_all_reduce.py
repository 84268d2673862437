# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Fake AITER custom allreduce for one process standing in for all ranks.

Every rank is taken to hold the same input, so the allreduce (sum) of
``x`` is ``world_size * x``. ``fused_ar_rms`` then adds the residual and
applies RMSNorm, in float32. Calls are logged as
``aiter.CustomAllreduce.<method>`` with their keyword arguments, so tests
can see which kernel (``use_1stage``) vLLM asked for.
"""

from contextlib import contextmanager

import torch
import torch.distributed as dist

from vllm_rocm_sim.recorder import RECORDER


class CustomAllreduce:
    def __init__(
        self,
        group=None,
        device=None,
        max_size: int = 8192 * 1024 * 8 * 2,
        world_size: int | None = None,
        fully_connected: bool = True,
    ) -> None:
        if world_size is None:
            world_size = dist.get_world_size(group) if group is not None else 1
        self.group = group
        self.device = device
        self.max_size = max_size
        self.world_size = world_size
        self.fully_connected = fully_connected
        self.disabled = False
        self.closed = False

    @contextmanager
    def capture(self):
        yield

    def close(self) -> None:
        self.closed = True

    def should_custom_ar(self, inp: torch.Tensor) -> bool:
        return inp.numel() * inp.element_size() < self.max_size

    def all_reduce(self, inp: torch.Tensor, **kwargs) -> torch.Tensor:
        RECORDER.record("aiter.CustomAllreduce.all_reduce", (inp,), kwargs)
        return (inp.float() * self.world_size).to(inp.dtype)

    def custom_all_reduce(self, inp: torch.Tensor, **kwargs) -> torch.Tensor:
        return self.all_reduce(inp, **kwargs)

    def custom_fused_ar_rms(
        self,
        inp: torch.Tensor,
        res_inp: torch.Tensor,
        w: torch.Tensor,
        eps: float,
        use_1stage: bool = False,
        gemma_norm: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The entry point newer vLLM calls (AITER picks graph registration
        itself); ``gemma_norm`` scales by ``1 + w``."""
        RECORDER.record(
            "aiter.CustomAllreduce.custom_fused_ar_rms",
            (inp, res_inp),
            {"w": w, "eps": eps, "use_1stage": use_1stage, "gemma_norm": gemma_norm},
        )
        return self._ar_rms(inp, res_inp, w.float() + 1 if gemma_norm else w, eps)

    def _ar_rms(
        self, inp: torch.Tensor, res_inp: torch.Tensor, w: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        residual = inp.float() * self.world_size + res_inp.float()
        variance = residual.pow(2).mean(dim=-1, keepdim=True)
        out = residual * torch.rsqrt(variance + eps) * w.float()
        return out.to(inp.dtype), residual.to(res_inp.dtype)

    def fused_ar_rms(
        self,
        inp: torch.Tensor,
        res_inp: torch.Tensor,
        *,
        w: torch.Tensor,
        eps: float,
        registered: bool = False,
        use_1stage: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        RECORDER.record(
            "aiter.CustomAllreduce.fused_ar_rms",
            (inp, res_inp),
            {"w": w, "eps": eps, "registered": registered, "use_1stage": use_1stage},
        )
        return self._ar_rms(inp, res_inp, w, eps)
