"""Hadamard vs dense attention blocks in bf16: numerical error and time, side by side.

The blocks are benchmarks/hadamard_block.py's (the model's own `Block`, initialised as in a
GPT of that depth). Error: each block's attention update (LayerNorm, QKV, causal SDPA, then
W_O or the Hadamard mixing) computed in bf16 against the same block in fp32 on the same
input, as max |bf16 - fp32| / max |fp32|; the Hadamard block's bf16 error must stay within
ERROR_FACTOR x the dense block's (its FWHT in bf16 -- the Triton kernel on a GPU -- adds no
more error than the W_O GEMM it replaces does). Time: forward + backward of the full block
in bf16, both variants alternated (benchmarks/timing.py), the median ratio reported.
"""

from __future__ import annotations

import copy
import statistics
from dataclasses import dataclass
from pathlib import Path

import torch

from benchmarks.acceptance.checks import Check, verdict
from benchmarks.hadamard_block import build, inputs, step_fn
from benchmarks.timing import interleaved_times
from scalelab.models.context import ForwardContext

ERROR_FACTOR = 2.0


@dataclass(frozen=True)
class BlockSizes:
    shapes: tuple[str, ...]
    batch: int
    seq: int
    repeats: int


GPU = BlockSizes(("124M", "1.3B"), batch=8, seq=1024, repeats=20)
CPU = BlockSizes(("nano", "micro"), batch=2, seq=32, repeats=3)


def relative_error(block32: torch.nn.Module, x: torch.Tensor) -> float:
    """max |bf16 - fp32| / max |fp32| of the block's attention update on `x` (fp32)."""
    block16 = copy.deepcopy(block32).to(torch.bfloat16)
    with torch.no_grad():
        ref = block32.attn_update(x, ForwardContext())
        low = block16.attn_update(x.to(torch.bfloat16), ForwardContext()).float()
    return float((low - ref).abs().max() / ref.abs().max())


def block_check(shape: str, errors: dict[str, float], ms: dict[str, float], where: str) -> Check:
    """The verdict of one shape from its measurements (no torch: testable alone)."""
    ok = errors["hadamard"] <= ERROR_FACTOR * errors["dense"]
    return Check(
        f"Hadamard vs dense block {shape} bf16",
        f"Hadamard attention update's bf16 error (max abs / max |fp32|) <= {ERROR_FACTOR:g} x "
        "dense's; block forward + backward time ratio reported",
        verdict(ok),
        f"error hadamard {errors['hadamard']:.2e} vs dense {errors['dense']:.2e}; "
        f"fwd+bwd {ms['hadamard']:.2f} / {ms['dense']:.2f} ms = "
        f"{ms['hadamard'] / ms['dense']:.2f}x dense ({where})",
    )


def run(cpu: bool, out: Path) -> list[Check]:
    sizes = CPU if cpu else GPU
    device = "cpu" if cpu else "cuda"
    sync = (lambda: None) if cpu else torch.cuda.synchronize
    where = "CPU" if cpu else torch.cuda.get_device_name()
    where += f", batch {sizes.batch} x {sizes.seq}, median of {sizes.repeats}"
    checks = []
    for shape in sizes.shapes:
        torch.manual_seed(0)
        x, grad = inputs(shape, sizes.batch, sizes.seq, device, torch.float32)
        x.requires_grad_(False)
        blocks = {v: build(shape, v, "block", device, torch.float32) for v in ("dense", "hadamard")}
        errors = {v: relative_error(b, x) for v, b in blocks.items()}
        x16, grad16 = x.to(torch.bfloat16).requires_grad_(True), grad.to(torch.bfloat16)
        steps = {v: step_fn(b.to(torch.bfloat16), "block", x16, grad16) for v, b in blocks.items()}
        wall, _ = interleaved_times(steps, sizes.repeats, sync)
        ms = {v: statistics.median(t) * 1e3 for v, t in wall.items()}
        checks.append(block_check(shape, errors, ms, where))
        del blocks, steps
    return checks
