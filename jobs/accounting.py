"""FLOPs and model-FLOPs utilisation (MFU).

MFU = model FLOPs executed per second / (devices x the device's dense bf16 peak). The
peaks are vendor datasheet numbers for dense (not 2:4 sparse) bf16 tensor-core math. CPUs
have no entry: there `perf/mfu` is not logged at all.
"""

from __future__ import annotations

# Dense bf16 peak FLOP/s per device, matched by substring of torch.cuda.get_device_name().
PEAK_BF16_FLOPS = {
    "H200": 989e12,
    "H100 PCIe": 756e12,
    "H100": 989e12,  # SXM / NVL
    "GH200": 989e12,
    "B200": 2250e12,
    "A100": 312e12,
    "L40S": 362e12,
    "L4": 121e12,
    "A10G": 70e12,
    "A10": 125e12,
    "V100": 125e12,  # fp16 tensor cores (no bf16)
}


def device_peak_flops(device: str) -> float | None:
    """Dense bf16 peak of this process's device; None on CPU or an unknown GPU."""
    if not device.startswith("cuda"):
        return None
    import torch

    name = torch.cuda.get_device_name(torch.device(device))
    for key in sorted(PEAK_BF16_FLOPS, key=len, reverse=True):  # 'H100 PCIe' before 'H100'
        if key in name:
            return PEAK_BF16_FLOPS[key]
    return None


def mfu(flops_per_s: float, world_size: int, peak: float | None) -> float | None:
    return None if peak is None else flops_per_s / (world_size * peak)
