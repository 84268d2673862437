# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""dtype names of the fake ``aiter``; fp8 follows the simulated arch."""

import torch

from ._sim import arch

fp8 = torch.float8_e4m3fnuz if arch().startswith("gfx94") else torch.float8_e4m3fn
bf16 = torch.bfloat16
fp16 = torch.float16
fp32 = torch.float32
i8 = torch.int8
i32 = torch.int32

d_dtypes = {
    "fp8": fp8,
    "bf16": bf16,
    "fp16": fp16,
    "fp32": fp32,
    "i8": i8,
    "i32": i32,
}
