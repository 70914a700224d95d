"""GPU models: dense bf16 peak FLOP/s and memory, keyed by exact names (torch-free).

One table for the job's MFU (`jobs.training.accounting`) and the planner (`orchestrator.plan.planner`).
A GPU is named two ways: the short name a sweep gives as `backend.gpu` ("H100 SXM"), and
the exact strings `torch.cuda.get_device_name()` / `nvidia-smi` report for it ("NVIDIA H100
80GB HBM3"). Both are matched exactly (after trimming and case folding), never by substring:
"H100" is a prefix of three different GPUs and "L4" of "L40" and "L40S".

Peaks are NVIDIA's datasheet numbers for dense (not 2:4 sparse) bf16 tensor-core math with
fp32 accumulation; a datasheet that prints only the sparse figure ("with sparsity") is
halved. Memory is the datasheet capacity in GiB (the driver reports slightly less; the
planner keeps a headroom for that). `source` says which document each row comes from.
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 2**30


@dataclass(frozen=True)
class GpuSpec:
    name: str  # the short name a sweep uses (backend.gpu)
    bf16_flops: float  # dense bf16 tensor-core peak, FLOP/s
    memory_gib: float  # device memory (datasheet capacity)
    device_names: tuple[str, ...]  # exact torch.cuda.get_device_name() strings
    source: str

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * GIB)


_H100 = "NVIDIA H100 Tensor Core GPU datasheet (2023): BF16 1,979 (SXM) / 1,513 (PCIe) TFLOPS with sparsity"
_H100_NVL = "NVIDIA H100 NVL datasheet (2024): BF16 1,671 TFLOPS with sparsity per GPU, 94 GB"
_H200 = "NVIDIA H200 Tensor Core GPU datasheet (2024): BF16 1,979 (SXM) / 1,671 (NVL) TFLOPS with sparsity, 141 GB"
_H800 = "NVIDIA H800 product brief: the H100's compute (BF16 1,979 SXM / 1,513 PCIe TFLOPS with sparsity), 80 GB"
_A100 = "NVIDIA A100 Tensor Core GPU datasheet (2021): BF16 312 TFLOPS dense, 40 or 80 GB"
_A800 = "NVIDIA A800 product brief: the A100's compute (BF16 312 TFLOPS dense), 40 or 80 GB"
_ADA = "NVIDIA datasheets (2023): BF16 with FP32 accumulate 181.05 (L40) / 362.05 (L40S) / 121 (L4) TFLOPS dense"
_4090 = "NVIDIA Ada Lovelace architecture whitepaper, Table 2: RTX 4090 BF16 (FP32 accumulate) 165.2 TFLOPS dense"
_A10 = "NVIDIA A10 datasheet (2021): BF16 125 TFLOPS dense (250 with sparsity), 24 GB"
_GH200 = "NVIDIA GH200 Grace Hopper Superchip datasheet (2023): the H100 SXM's BF16 (1,979 with sparsity), 96 GB HBM3"
_B200 = "NVIDIA HGX B200 datasheet (2024): FP16/BF16 4.5 PFLOPS with sparsity per GPU, 180 GB"
_V100 = "NVIDIA V100 datasheet (2020): no bf16 tensor cores; the fp16 tensor peak (125 SXM2 / 112 PCIe TFLOPS)"

GPUS: dict[str, GpuSpec] = {
    g.name: g
    for g in (
        GpuSpec("H100 SXM", 989e12, 80, ("NVIDIA H100 80GB HBM3", "NVIDIA H100 SXM5 80GB"), _H100),
        GpuSpec("H100 PCIe", 756e12, 80, ("NVIDIA H100 PCIe",), _H100),
        GpuSpec("H100 NVL", 835e12, 94, ("NVIDIA H100 NVL",), _H100_NVL),
        GpuSpec("H200", 989e12, 141, ("NVIDIA H200",), _H200),
        GpuSpec("H200 NVL", 835e12, 141, ("NVIDIA H200 NVL",), _H200),
        GpuSpec("H800", 989e12, 80, ("NVIDIA H800", "NVIDIA H800 80GB HBM3"), _H800),
        GpuSpec("H800 PCIe", 756e12, 80, ("NVIDIA H800 PCIe",), _H800),
        GpuSpec("GH200", 989e12, 96, ("NVIDIA GH200 480GB",), _GH200),
        GpuSpec("B200", 2250e12, 180, ("NVIDIA B200",), _B200),
        GpuSpec("A100 40GB", 312e12, 40, ("NVIDIA A100-SXM4-40GB", "NVIDIA A100-PCIE-40GB"), _A100),
        GpuSpec("A100 80GB", 312e12, 80, ("NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe"), _A100),
        GpuSpec("A800 40GB", 312e12, 40, ("NVIDIA A800-SXM4-40GB", "NVIDIA A800 40GB PCIe"), _A800),
        GpuSpec("A800 80GB", 312e12, 80, ("NVIDIA A800-SXM4-80GB", "NVIDIA A800 80GB PCIe"), _A800),
        GpuSpec("L40", 181e12, 48, ("NVIDIA L40",), _ADA),
        GpuSpec("L40S", 362e12, 48, ("NVIDIA L40S",), _ADA),
        GpuSpec("L4", 121e12, 24, ("NVIDIA L4",), _ADA),
        GpuSpec("A10", 125e12, 24, ("NVIDIA A10",), _A10),
        GpuSpec("RTX 4090", 165e12, 24, ("NVIDIA GeForce RTX 4090",), _4090),
        GpuSpec("V100 16GB", 125e12, 16, ("Tesla V100-SXM2-16GB",), _V100),
        GpuSpec("V100 32GB", 125e12, 32, ("Tesla V100-SXM2-32GB",), _V100),
        GpuSpec("V100 PCIe 16GB", 112e12, 16, ("Tesla V100-PCIE-16GB",), _V100),
        GpuSpec("V100 PCIe 32GB", 112e12, 32, ("Tesla V100-PCIE-32GB",), _V100),
    )
}


def _key(name: str) -> str:
    return " ".join(name.split()).casefold()


_BY_NAME = {_key(g.name): g for g in GPUS.values()}
_BY_DEVICE = {_key(d): g for g in GPUS.values() for d in g.device_names}


def gpu_spec(name: str) -> GpuSpec:
    """The GPU a sweep names (`backend.gpu`), by short or device name; ValueError lists
    the known names."""
    found = _BY_NAME.get(_key(name)) or _BY_DEVICE.get(_key(name))
    if found is None:
        raise ValueError(f"unknown GPU {name!r}; known: {', '.join(GPUS)}")
    return found


def device_gpu(device_name: str) -> GpuSpec | None:
    """The table's entry for a `torch.cuda.get_device_name()` string; None if unknown."""
    return _BY_DEVICE.get(_key(device_name))
