"""FLOPs and model-FLOPs utilisation (MFU).

MFU = model FLOPs executed per second / (devices x the device's dense bf16 peak). The
peaks come from jobs/gpus.py, looked up by the exact name torch reports for the device; a
GPU not in that table, and every CPU, has no peak: there MFU is not logged at all.

Two counts of the model FLOPs (models/flops.py), each logged as its own metric:
`perf/mfu` counts attention over the full T x T matrix, the convention of the compute
budget, `compute/flops` and the sweep's `estimate.mfu`; `perf/mfu_causal` counts the
causal triangle a causal kernel executes ((T + 1) / 2 keys per query), lower by the
attention share of the FLOPs: the number to compare with published causal-attention MFUs.
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


def mfu_metrics(
    tokens_per_s: float, flops_per_token: float, causal_flops_per_token: float,
    world_size: int, peak: float | None,
) -> dict[str, float]:  # fmt: skip
    """perf/mfu (full T x T attention) and perf/mfu_causal; none without a peak."""
    if peak is None:
        return {}
    return {
        "perf/mfu": mfu(tokens_per_s * flops_per_token, world_size, peak),
        "perf/mfu_causal": mfu(tokens_per_s * causal_flops_per_token, world_size, peak),
    }
