# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""pytest plugin of the ROCm simulation: ``pytest -p vllm_rocm_sim.plugin``.

Importing this module activates the simulation (see ``vllm_rocm_sim``),
which is why it must be loaded with ``-p``: pytest imports ``-p`` plugins
before any conftest, and ``tests/conftest.py`` imports vLLM. It also sets
``VLLM_DISABLE_SHARED_EXPERTS_STREAM=1`` unless set: there are no streams.

Collection: tests under ``tests/rocm`` of the vLLM tree that do not use the
simulation were written for ROCm GPUs (HIP tensors, real kernels) and are
skipped; tests that use it (and every test under ``tests/rocm``) get the
``skip_global_cleanup`` marker, as there is no accelerator to clean up
after them.

Fixtures:

* ``rocm_sim``: checks the platform is the simulated ROCm one; gives a
  ``Simulation`` (``arch``, ``platform``, ``calls``).
* ``aiter_env``: ``VLLM_ROCM_USE_AITER=1`` and refreshed gates for the
  test; ``aiter_env.set(name, value)`` / ``aiter_env.unset(name)`` change
  more switches (refreshing the gates each time); restored afterwards.
* ``sim_calls``: the call recorder, emptied before and after the test.
* ``aiter_cpu_ops``: ``aiter_cpu_ops.register(op, impl=None)`` gives
  ``op`` a CPU impl for the test (vLLM's own Python impl by default).
* ``rocm_arch``: ``rocm_arch("gfx950")`` switches the arch flags of
  ``vllm.platforms.rocm`` within a test (values vLLM cached at import,
  such as ``vllm._aiter_ops.FP8_DTYPE``, keep the process arch).
* ``cpu_vllm_config``: a current ``VllmConfig`` on the CPU device, so
  layers can be constructed.
* ``cpu_dist_env`` (module scope): a single-rank (gloo) distributed and
  model parallel state, which layers such as ``FusedMoE`` need to be
  constructed; torn down after the module.
* ``stream_capture``: ``with stream_capture(): ...`` makes
  ``torch.cuda.is_current_stream_capturing()`` True, as while a graph is
  captured. Outside it the function returns False on every sim test
  (CPU builds of torch raise there).
"""

import importlib
import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, suppress
from dataclasses import dataclass
from typing import Any

import pytest
import torch

import vllm_rocm_sim as sim
from vllm_rocm_sim import ops
from vllm_rocm_sim.recorder import (
    DEVICE_SYNC,
    RECORDER,
    STREAM_SYNC,
    CallRecorder,
)

sim.activate()
ops.register_aten_cpu_gaps()
# CPU builds of torch cannot create CUDA/HIP streams; the overlap of shared
# experts with routing on a second stream is not simulated.
os.environ.setdefault("VLLM_DISABLE_SHARED_EXPERTS_STREAM", "1")


SIM_FIXTURE = "rocm_sim"
GPU_ONLY_DIR = ("tests", "rocm")
_NO_CLEANUP = pytest.mark.skip_global_cleanup
_GPU_ONLY = pytest.mark.skip(reason="needs a ROCm GPU; not a ROCm simulation test")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_only_dir = config.rootpath.joinpath(*GPU_ONLY_DIR)
    for item in items:
        uses_sim = SIM_FIXTURE in getattr(item, "fixturenames", ())
        in_gpu_only_dir = item.path.is_relative_to(gpu_only_dir)
        if uses_sim or in_gpu_only_dir:
            item.add_marker(_NO_CLEANUP)
        if in_gpu_only_dir and not uses_sim:
            item.add_marker(_GPU_ONLY)


@dataclass
class Simulation:
    arch: str
    platform: Any
    calls: CallRecorder


@pytest.fixture
def rocm_sim() -> Simulation:
    sim.check_platform()
    from vllm.platforms import current_platform

    return Simulation(sim.active_arch(), current_platform, RECORDER)


class AiterEnv:
    def __init__(self, mp: pytest.MonkeyPatch) -> None:
        self._mp = mp

    @staticmethod
    def refresh() -> None:
        from vllm._aiter_ops import rocm_aiter_ops

        rocm_aiter_ops.refresh_env_variables()

    def set(self, name: str, value: str) -> None:
        self._mp.setenv(name, value)
        self.refresh()

    def unset(self, name: str) -> None:
        self._mp.delenv(name, raising=False)
        self.refresh()


@pytest.fixture
def aiter_env(rocm_sim: Simulation) -> Iterator[AiterEnv]:
    with pytest.MonkeyPatch.context() as mp:
        env = AiterEnv(mp)
        env.set("VLLM_ROCM_USE_AITER", "1")
        yield env
    AiterEnv.refresh()


@pytest.fixture
def sim_calls() -> Iterator[CallRecorder]:
    RECORDER.clear()
    yield RECORDER
    RECORDER.clear()


class CpuOps:
    def __init__(self) -> None:
        self._saved: dict[str, Callable | None] = {}

    def register(self, op: str, impl: Callable | None = None) -> None:
        previous = ops.register_cpu_impl(op, impl)
        self._saved.setdefault(op, previous)

    def restore(self) -> None:
        for op, previous in self._saved.items():
            ops.restore_cpu_impl(op, previous)
        self._saved.clear()


@pytest.fixture
def aiter_cpu_ops(rocm_sim: Simulation) -> Iterator[CpuOps]:
    cpu_ops = CpuOps()
    yield cpu_ops
    cpu_ops.restore()


def _clear_capability_cache() -> None:
    from vllm.platforms.rocm import RocmPlatform

    RocmPlatform.get_device_capability.cache_clear()


@pytest.fixture
def rocm_arch(rocm_sim: Simulation) -> Iterator[Callable[[str], None]]:
    import vllm.platforms.rocm as rocm

    with pytest.MonkeyPatch.context() as mp:

        def switch(arch: str) -> None:
            mp.setenv(sim.SIM_ARCH_ENV, sim._check_arch(arch))
            for name, value in sim.arch_flags(arch).items():
                # Older releases lack some of the flags.
                if name == "_GCN_ARCH" or hasattr(rocm, name):
                    mp.setattr(rocm, name, value)
            _clear_capability_cache()

        yield switch
    _clear_capability_cache()


@pytest.fixture
def cpu_vllm_config(rocm_sim: Simulation) -> Iterator[Any]:
    from vllm.config import DeviceConfig, VllmConfig, set_current_vllm_config

    config = VllmConfig(device_config=DeviceConfig(device="cpu"))
    with set_current_vllm_config(config):
        yield config


@pytest.fixture(scope="module")
def cpu_dist_env() -> Iterator[None]:
    sim.check_platform()
    from vllm.config import DeviceConfig, VllmConfig, set_current_vllm_config
    from vllm.distributed import (
        init_distributed_environment,
        initialize_model_parallel,
    )
    from vllm.distributed.parallel_state import (
        destroy_distributed_environment,
        destroy_model_parallel,
    )

    fd, path = tempfile.mkstemp()
    os.close(fd)
    try:
        config = VllmConfig(device_config=DeviceConfig(device="cpu"))
        with set_current_vllm_config(config):
            init_distributed_environment(
                world_size=1,
                rank=0,
                local_rank=0,
                distributed_init_method=f"file://{path}",
                backend="gloo",
            )
            initialize_model_parallel(1, 1)
        yield
    finally:
        destroy_model_parallel()
        destroy_distributed_environment()
        with suppress(FileNotFoundError):
            os.unlink(path)


class _StreamCapture:
    capturing = False

    @classmethod
    def is_current_stream_capturing(cls) -> bool:
        return cls.capturing


@pytest.fixture(autouse=True)
def _simulated_stream_capture(monkeypatch: pytest.MonkeyPatch) -> None:
    if sim.is_active():
        monkeypatch.setattr(
            torch.cuda,
            "is_current_stream_capturing",
            _StreamCapture.is_current_stream_capturing,
        )


class SimStream:
    """What ``torch.cuda.current_stream()`` gives under the simulation: its
    ``synchronize()`` is recorded as ``torch.cuda.Stream.synchronize``."""

    def __init__(self, device: Any = None) -> None:
        self.device = device

    def synchronize(self) -> None:
        RECORDER.record(STREAM_SYNC, (), {"device": _device_name(self.device)})

    def query(self) -> bool:
        return True


def _device_name(device: Any) -> str | None:
    return None if device is None else str(device)


def _current_stream(device: Any = None) -> SimStream:
    return SimStream(device)


def _synchronize(device: Any = None) -> None:
    RECORDER.record(DEVICE_SYNC, (), {"device": _device_name(device)})


@pytest.fixture(autouse=True)
def _simulated_streams(monkeypatch: pytest.MonkeyPatch) -> None:
    if sim.is_active():
        monkeypatch.setattr(torch.cuda, "current_stream", _current_stream)
        monkeypatch.setattr(torch.cuda, "synchronize", _synchronize)


@pytest.fixture(autouse=True)
def _no_pinned_memory(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The simulated host has no device runtime: CPU builds of torch cannot pin
    memory, so the simulated platform says so, and vLLM's helpers that pin
    when the platform allows it copy from pageable memory instead. Where a
    release caches the answer (``PIN_MEMORY`` of ``vllm.utils.torch_utils``,
    the cached ``is_pin_memory_available`` of ``vllm.utils.platform_utils``),
    the cache is set or cleared too."""
    if not sim.is_active():
        yield
        return
    from vllm.platforms.rocm import RocmPlatform

    monkeypatch.setattr(RocmPlatform, "is_pin_memory_available", classmethod(lambda cls: False))
    cached = []
    for name in ("vllm.utils.platform_utils", "vllm.utils"):
        with suppress(ImportError):
            fn = getattr(importlib.import_module(name), "is_pin_memory_available", None)
            if hasattr(fn, "cache_clear"):
                cached.append(fn)
    with suppress(ImportError):
        torch_utils = importlib.import_module("vllm.utils.torch_utils")
        if "PIN_MEMORY" in vars(torch_utils):
            monkeypatch.setattr(torch_utils, "PIN_MEMORY", False)
    for fn in cached:
        fn.cache_clear()
    yield
    for fn in cached:
        fn.cache_clear()


@pytest.fixture
def stream_capture() -> Iterator[Callable[[], AbstractContextManager[None]]]:
    @contextmanager
    def capture() -> Iterator[None]:
        _StreamCapture.capturing = True
        try:
            yield
        finally:
            _StreamCapture.capturing = False

    yield capture
    _StreamCapture.capturing = False
