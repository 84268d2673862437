# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Plumbing shared by the modules of the fake ``aiter`` package."""

import functools
import os
from collections.abc import Callable

from vllm_rocm_sim.recorder import RECORDER


def arch() -> str:
    return os.environ.get("VLLM_ROCM_SIM_ARCH", "gfx942")


def recorded(fn: Callable) -> Callable:
    """Log every call of a fake aiter function as ``aiter.<name>``."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        RECORDER.record(f"aiter.{fn.__name__}", args, kwargs)
        return fn(*args, **kwargs)

    return wrapper
