# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Fake ``amdsmi`` for the ROCm simulation (see ``vllm_rocm_sim``).

Reports ``VLLM_ROCM_SIM_NUM_GPUS`` (default 8) Instinct GPUs of the arch
named by ``VLLM_ROCM_SIM_ARCH`` (``gfx942``: MI300X, ``gfx950``: MI355X),
all linked to each other by one XGMI hop. Only the calls vLLM makes are
provided.
"""

import os

_ARCHS = {
    # arch: (PCI device id, market name)
    "gfx942": ("0x74a1", "AMD Instinct MI300X"),
    "gfx950": ("0x75a3", "AMD Instinct MI355X"),
}
# VRAM per GPU in GiB.
_VRAM_GIB = {"gfx942": 192, "gfx950": 288}
_LINK_TYPE_XGMI = 2


class AmdSmiException(Exception):
    pass


class AmdSmiInitFlags:
    INIT_ALL_PROCESSORS = 0xFFFFFFFF
    INIT_AMD_CPUS = 1 << 0
    INIT_AMD_GPUS = 1 << 1


class AmdSmiMemoryType:
    VRAM = 0
    VIS_VRAM = 1
    GTT = 2


def _arch() -> str:
    arch = os.environ.get("VLLM_ROCM_SIM_ARCH", "gfx942")
    if arch not in _ARCHS:
        raise AmdSmiException(f"simulated arch {arch!r} is not one of {sorted(_ARCHS)}")
    return arch


def _num_gpus() -> int:
    return int(os.environ.get("VLLM_ROCM_SIM_NUM_GPUS", "8"))


def amdsmi_init(flag=AmdSmiInitFlags.INIT_AMD_GPUS) -> None:
    pass


def amdsmi_shut_down() -> None:
    pass


def amdsmi_get_processor_handles() -> list[int]:
    return list(range(_num_gpus()))


def _check_handle(handle: int) -> None:
    if handle not in range(_num_gpus()):
        raise AmdSmiException(f"no simulated GPU with handle {handle!r}")


def amdsmi_get_gpu_asic_info(processor_handle: int) -> dict[str, str]:
    handle = processor_handle
    _check_handle(handle)
    arch = _arch()
    device_id, market_name = _ARCHS[arch]
    return {
        "market_name": market_name,
        "vendor_id": "0x1002",
        "vendor_name": "Advanced Micro Devices Inc. [AMD/ATI]",
        "device_id": device_id,
        "rev_id": "0x00",
        "asic_serial": f"0x{handle:016x}",
        "target_graphics_version": arch,
    }


def amdsmi_get_gpu_memory_total(processor_handle: int, mem_type: int) -> int:
    _check_handle(processor_handle)
    if mem_type != AmdSmiMemoryType.VRAM:
        raise AmdSmiException(f"simulated GPUs report VRAM only, not {mem_type!r}")
    return _VRAM_GIB[_arch()] << 30


def amdsmi_get_gpu_device_uuid(processor_handle: int) -> str:
    _check_handle(processor_handle)
    return f"00000000-0000-0000-0000-{processor_handle:012x}"


def amdsmi_topo_get_link_type(
    processor_handle_src: int, processor_handle_dst: int
) -> dict[str, int]:
    _check_handle(processor_handle_src)
    _check_handle(processor_handle_dst)
    hops = 0 if processor_handle_src == processor_handle_dst else 1
    return {"hops": hops, "type": _LINK_TYPE_XGMI}


def amdsmi_topo_get_numa_node_number(processor_handle: int) -> int:
    _check_handle(processor_handle)
    return 0
