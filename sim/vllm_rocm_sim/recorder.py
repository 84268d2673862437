# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Call log shared by the fake ``aiter`` functions and the CPU op impls."""

from dataclasses import dataclass
from typing import Any

import torch

# Names of the host waits the simulation records (see the plugin's streams).
STREAM_SYNC = "torch.cuda.Stream.synchronize"
DEVICE_SYNC = "torch.cuda.synchronize"


def _snapshot(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, (list, tuple)):
        return type(value)(_snapshot(v) for v in value)
    return value


@dataclass
class Call:
    """One recorded call. Tensors are copies taken when the call started."""

    name: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


class CallRecorder:
    """Records calls by name: ``aiter.<function>`` for fake aiter functions,
    ``vllm::<op>`` for custom ops run through a CPU impl of the simulation,
    ``STREAM_SYNC``/``DEVICE_SYNC`` for host waits on a simulated stream or
    device."""

    def __init__(self) -> None:
        self.calls: list[Call] = []

    def record(self, name: str, args: tuple, kwargs: dict) -> Call:
        call = Call(name, _snapshot(tuple(args)), _snapshot(dict(kwargs)))
        self.calls.append(call)
        return call

    def named(self, name: str) -> list[Call]:
        return [c for c in self.calls if c.name == name]

    def count(self, name: str) -> int:
        return len(self.named(name))

    def names(self) -> list[str]:
        return [c.name for c in self.calls]

    def clear(self) -> None:
        self.calls.clear()


RECORDER = CallRecorder()
