"""torch.version.hip for vLLM's setup.py in a precompiled ROCm build.

This directory is on PYTHONPATH only for the build of a precompiled
``--device rocm`` wheel (vllm_fork.wheel.plan.ROCM_VIEW). vLLM's setup.py
selects the ROCm target (its requirements/rocm.txt, its list of extensions,
which binaries it copies from the wheel) by ``torch.version.hip``; in
precompiled mode it compiles nothing and reads nothing else from torch that
reaches the wheel (the version comes from VLLM_VERSION_OVERRIDE). When the build
torch is not a ROCm build, ``torch.version.hip`` is set to the ROCm version of
the pinned upstream wheel (VLLM_FORK_TORCH_HIP); a ROCm torch is left as it is.
"""

import os

_hip = os.environ.get("VLLM_FORK_TORCH_HIP")
if _hip:
    import torch

    if getattr(torch.version, "hip", None) is None:
        torch.version.hip = _hip
