"""The job's MFU peak comes from the exact device name (jobs/gpus.py), never a substring."""

import pytest
import torch

from scalelab.jobs.training.accounting import device_peak_flops


@pytest.mark.parametrize(
    ("device_name", "peak"),
    [
        ("NVIDIA H100 80GB HBM3", 989e12),
        ("NVIDIA H100 PCIe", 756e12),
        ("NVIDIA H100 NVL", 835e12),  # was 989e12: matched by the substring 'H100'
        ("NVIDIA L40", 181e12),  # was 121e12: matched by the substring 'L4'
        ("NVIDIA L40S", 362e12),
        ("NVIDIA L4", 121e12),
        ("NVIDIA H800", 989e12),  # was None: no entry
        ("NVIDIA A800-SXM4-80GB", 312e12),  # was None
        ("NVIDIA H200", 989e12),
        ("NVIDIA GeForce RTX 4090", 165e12),
        ("NVIDIA H20", None),  # unknown: no MFU rather than a wrong one
        ("Some H100-like accelerator", None),
    ],
)
def test_peak_is_looked_up_by_the_exact_device_name(monkeypatch, device_name, peak):
    # No GPU here: the device name is the one thing that cannot be produced for real.
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: device_name)
    assert device_peak_flops("cuda:0") == peak


def test_no_peak_on_cpu():
    assert device_peak_flops("cpu") is None


def test_a_sweep_names_a_gpu_by_its_short_or_device_name():
    from scalelab.jobs.gpus import GPUS, gpu_spec

    assert gpu_spec("H100 NVL") is gpu_spec("nvidia h100  nvl") is GPUS["H100 NVL"]
    assert gpu_spec("h200").memory_gib == 141
    with pytest.raises(ValueError, match="unknown GPU 'H100'; known: H100 SXM, H100 PCIe"):
        gpu_spec("H100")  # ambiguous names are not guessed
    names = [d for g in GPUS.values() for d in g.device_names]
    assert len(names) == len(set(names))  # one device name, one row
