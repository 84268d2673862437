# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""ROCm simulation: run ROCm/AITER-only vLLM code paths on a CPU-only host.

Pieces:

* ``site/amdsmi``: a fake ``amdsmi`` reporting Instinct GPUs of one arch,
  so ``vllm.platforms.current_platform`` resolves to ``RocmPlatform``.
  ``gfx942`` (MI300X) by default; ``VLLM_ROCM_SIM_ARCH=gfx950`` (MI355X)
  or ``activate(arch="gfx950")`` selects the other one.
* ``site/aiter``: a fake ``aiter`` whose functions compute reference
  results with torch, so ``find_spec("aiter")`` succeeds and the
  ``rocm_aiter_ops.is_*_enabled()`` gates follow the ``VLLM_ROCM_USE_AITER*``
  environment variables as on a real MI300 host.
* ``ops``: CPU impls for the ``vllm::rocm_aiter_*`` custom ops, which vLLM
  registers for the CUDA dispatch key only.
* ``recorder``: one log of the calls to fake aiter functions and CPU ops.
* ``plugin``: the pytest entry point with the fixtures.

Entry point. The simulation must be active before anything resolves
``vllm.platforms.current_platform``, and ``tests/conftest.py`` imports vLLM.
So load it as a pytest plugin, which pytest imports before any conftest,
in a pytest process of its own (it changes the platform for the process),
with the ``sim/`` directory of the fork repository on ``PYTHONPATH``
(``vllm-fork test`` does both)::

    PYTHONPATH=<fork>/sim python -m pytest -p vllm_rocm_sim.plugin tests/rocm/...

(add ``--noconftest`` to skip the root conftest and its import time; the
fixtures live in the plugin). Outside pytest, call ``activate()`` before
importing vLLM. ``activate()`` refuses to run once the platform has been
resolved or ``vllm._aiter_ops`` imported, instead of half-working.

One copy serves every vLLM base of the fork: where releases differ, the
code detects the feature (``hasattr``, tolerated missing modules) instead
of keeping a copy per release. What it proves and cannot prove: see
``sim/README.md``.
"""

import os
import sys
from pathlib import Path

SIM_ARCH_ENV = "VLLM_ROCM_SIM_ARCH"
ARCHS = ("gfx942", "gfx950")
DEFAULT_ARCH = "gfx942"
SITE_DIR = Path(__file__).resolve().parent / "site"
FAKE_MODULES = ("amdsmi", "aiter")

_active_arch: str | None = None


def is_active() -> bool:
    return _active_arch is not None


def active_arch() -> str | None:
    return _active_arch


def _check_arch(arch: str) -> str:
    if arch not in ARCHS:
        raise ValueError(f"unknown simulated arch {arch!r}; choose one of {ARCHS}")
    return arch


def _check_not_resolved() -> None:
    platforms = sys.modules.get("vllm.platforms")
    resolved = getattr(platforms, "_current_platform", None)
    if resolved is not None or "vllm._aiter_ops" in sys.modules:
        raise RuntimeError(
            "the ROCm simulation must be activated before vLLM resolves its "
            f"platform (already resolved: {resolved!r}); run pytest with "
            "'-p vllm_rocm_sim.plugin' in a process of its own"
        )
    for name in FAKE_MODULES:
        module = sys.modules.get(name)
        origin = getattr(module, "__file__", None) or ""
        if module is not None and not origin.startswith(str(SITE_DIR)):
            raise RuntimeError(
                f"a real {name!r} module is already imported from {origin!r}; "
                "the ROCm simulation cannot replace it"
            )


def activate(arch: str | None = None) -> str:
    """Put the fake ``amdsmi``/``aiter`` first on ``sys.path`` and fix the
    simulated arch for this process. Returns the arch. Idempotent."""
    global _active_arch
    arch = _check_arch(arch or os.environ.get(SIM_ARCH_ENV) or DEFAULT_ARCH)
    if _active_arch is not None:
        if arch != _active_arch:
            raise RuntimeError(
                f"ROCm simulation already active as {_active_arch}; the arch "
                "is fixed per process (use the rocm_arch fixture to switch "
                "the platform flags within a test)"
            )
        return arch
    _check_not_resolved()
    os.environ[SIM_ARCH_ENV] = arch
    sys.path.insert(0, str(SITE_DIR))
    _active_arch = arch
    return arch


def check_platform() -> None:
    """Raise unless vLLM's platform is the simulated ROCm one."""
    from vllm.platforms import current_platform
    from vllm.platforms.rocm import RocmPlatform

    if not is_active() or not isinstance(current_platform, RocmPlatform):
        raise RuntimeError(
            f"vLLM platform is {type(current_platform).__name__}, not the "
            "simulated ROCm one: run pytest with '-p vllm_rocm_sim.plugin'"
        )


def arch_flags(arch: str) -> dict[str, object]:
    """Values of the arch globals of ``vllm.platforms.rocm`` for ``arch``."""
    return {
        "_GCN_ARCH": arch,
        "_ON_GFX1X": any(a in arch for a in ("gfx11", "gfx12")),
        "_ON_GFX12X": "gfx12" in arch,
        "_ON_MI3XX": any(a in arch for a in ("gfx942", "gfx950")),
        "_ON_GFX9": any(a in arch for a in ("gfx90a", "gfx942", "gfx950")),
        "_ON_GFX90A": "gfx90a" in arch,
        "_ON_GFX942": "gfx942" in arch,
        "_ON_GFX950": "gfx950" in arch,
    }
