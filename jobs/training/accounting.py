"""FLOPs and model-FLOPs utilisation (MFU).

MFU = model FLOPs executed per second / (devices x the device's dense bf16 peak). The
peaks come from jobs/gpus.py, looked up by the exact name torch reports for the device; a
GPU not in that table, and every CPU, has no peak: there `perf/mfu` is not logged at all.
"""

from __future__ import annotations

from scalelab.jobs.gpus import device_gpu


def device_peak_flops(device: str) -> float | None:
    """Dense bf16 peak of this process's device; None on CPU or an unknown GPU."""
    if not device.startswith("cuda"):
        return None
    import torch

    gpu = device_gpu(torch.cuda.get_device_name(torch.device(device)))
    return None if gpu is None else gpu.bf16_flops


def mfu(flops_per_s: float, world_size: int, peak: float | None) -> float | None:
    return None if peak is None else flops_per_s / (world_size * peak)
