"""The Triton FWHT on a GPU: its speed against a memory copy, and its exactness at the
training shape, at the ladder's widths (the paper presets of models/sizes.py, which
sweeps/hadamard.yaml trains: 768 = 12 x 64 and 1536, 2560 have a Paley block, the rest are
powers of two).

Speed: the Triton kernel (`backend="triton"`, after its self-check) on a 256 MiB bf16
tensor, rows = 256 MiB / (2 d), against `out.copy_(x)` of the same tensor. Both read it
once and write it once, so a memory-bound transform runs close to the copy: goal time <=
COPY_FACTOR x the copy. Timed as benchmarks/hadamard.py's gpu_table (median of
synchronised repeats, the same GB/s: bytes read + written / time), each repeat CALLS calls
back to back so that launch latency is amortised as in a training step.

Exactness: 8 x 1024 tokens in bf16, the forward transform x H / sqrt(d) and the transposed
one (the backward's g H^T / sqrt(d)), against the fp64 dense reference (kernels/reference.py)
and against the torch path (kernels/torch_fwht.py). Both kernels sum the +-1 terms in fp32
(Triton's 3xTF32 dots are about as exact) and round once to bf16, so:
- against fp64, every element is off by at most half a bf16 ulp, 2^-8 of its value (bf16
  keeps 8 significant bits), plus the fp32 sum's ~2^-20: norm-relative error <= 2^-8;
- against the torch path, the two fp32 sums differ by ~2^-20 relative, so they round to
  different bf16 values only that close to a rounding midpoint: a small fraction of the
  elements differ (goal <= 1%), mostly by one ulp, far inside a norm-relative 2^-8 (the
  bound of tests/kernels/test_triton_gpu.py). A wrong block or sign differs by O(1) almost
  everywhere. (No per-element ulp bound: an element that cancels to near zero keeps the
  fp32 sums' absolute error, many of its own ulps.)
On the CPU the speed rows are skipped (the torch path's time on 1 MiB is shown instead) and
the exactness row runs the torch path against fp64 at a small shape.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from benchmarks.acceptance.checks import NO_GPU, Check, memory, verdict
from benchmarks.hadamard import median_seconds
from scalelab.kernels.hadamard import hadamard_transform
from scalelab.kernels.reference import dense_hadamard_matrix
from scalelab.models.sizes import SIZES

LADDER_WIDTHS = tuple(p.d_model for p in SIZES.values() if not p.cpu_sized)
COPY_FACTOR = 1.5  # Triton time / copy time
FP64_TOL = 2.0**-8  # norm-relative error against the fp64 reference: one bf16 rounding
TORCH_TOL = 2.0**-8  # norm-relative difference between Triton and the torch path
TORCH_MAX_DIFFERING = 0.01  # fraction of elements where Triton and the torch path differ

SPEED_GOAL = (
    f"Triton time <= {COPY_FACTOR:g} x out.copy_(x) on the same 256 MiB bf16 tensor (both "
    "read it once and write it once: memory-bound); GB/s reported"
)
EXACT_GOAL = (
    f"8 x 1024 tokens bf16, forward and transposed: norm-relative error vs the fp64 dense "
    f"reference <= 2^-8 (one bf16 rounding); Triton vs the torch path: <= "
    f"{TORCH_MAX_DIFFERING:.0%} of elements differ, norm-relative difference <= 2^-8"
)


@dataclass(frozen=True)
class FwhtSizes:
    widths: tuple[int, ...]
    speed_bytes: int  # of the bf16 tensor timed
    exact_widths: tuple[int, ...]
    exact_rows: int
    repeats: int
    calls: int  # back to back per timed repeat


GPU = FwhtSizes(LADDER_WIDTHS, 256 << 20, LADDER_WIDTHS, 8 * 1024, repeats=7, calls=10)
CPU = FwhtSizes(LADDER_WIDTHS, 1 << 20, (768,), 64, repeats=3, calls=1)


@dataclass(frozen=True)
class Exactness:
    kernel: str  # what was measured against fp64: "Triton" or "torch path"
    rows: int
    vs_fp64: tuple[float, float]  # norm-relative error, forward and transposed
    # (fraction of elements that differ, norm-relative difference), the worse of forward
    # and transposed; None where Triton did not run
    vs_torch: tuple[float, float] | None = None


def speed_name(d: int) -> str:
    return f"FWHT Triton vs copy d={d} bf16"


def exact_name(d: int) -> str:
    return f"FWHT exact d={d} bf16"


def speed_check(d: int, rows: int, triton_s: float, copy_s: float, where: str) -> Check:
    """The verdict of one width's timings (seconds per call; no torch: testable alone)."""
    moved = 2 * rows * d * 2  # bf16 read once and written once
    return Check(
        speed_name(d),
        SPEED_GOAL,
        verdict(triton_s <= COPY_FACTOR * copy_s),
        f"Triton {triton_s * 1e6:.0f} us ({moved / triton_s / 1e9:.0f} GB/s), copy "
        f"{copy_s * 1e6:.0f} us ({moved / copy_s / 1e9:.0f} GB/s) = {triton_s / copy_s:.2f}x "
        f"the copy ({rows} x {d}, {where})",
    )


def exact_check(d: int, m: Exactness, where: str) -> Check:
    """The verdict of one width's errors (no torch: testable alone)."""
    ok = max(m.vs_fp64) <= FP64_TOL
    text = (
        f"{m.kernel} vs fp64: forward {m.vs_fp64[0]:.2e}, transposed {m.vs_fp64[1]:.2e} "
        f"(bound {FP64_TOL:.2e})"
    )
    if m.vs_torch is None:
        text += f"; Triton vs the torch path: {NO_GPU}"
    else:
        differing, difference = m.vs_torch
        ok = ok and differing <= TORCH_MAX_DIFFERING and difference <= TORCH_TOL
        text += (
            f"; vs the torch path: {differing:.3%} of elements differ, norm-relative "
            f"{difference:.2e}"
        )
    return Check(exact_name(d), EXACT_GOAL, verdict(ok), f"{text} ({m.rows} x {d}, {where})")


def failed(name: str, goal: str, e: Exception) -> Check:
    """A width that raised (a compile failure, say) fails its own row; the others still run."""
    return Check(name, goal, "fail", f"{type(e).__name__}: {e}"[:300])


def _relative(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.double() - want).norm() / want.norm()).item()


def _both_ways(x: torch.Tensor, g: torch.Tensor, backend: str) -> tuple[torch.Tensor, ...]:
    """(x H / sqrt d, g H^T / sqrt d): the forward and, through autograd, the transposed."""
    leaf = x.detach().requires_grad_()
    y = hadamard_transform(leaf, backend=backend)
    (gx,) = torch.autograd.grad(y, leaf, g)
    return y.detach(), gx


def measure_exactness(d: int, rows: int, device: str, triton: bool) -> Exactness:
    gen = torch.Generator().manual_seed(d)
    x, g = (torch.randn(rows, d, generator=gen).to(device, torch.bfloat16) for _ in range(2))
    h = dense_hadamard_matrix(d).to(device)  # fp64, orthonormal
    want = (x.double() @ h, g.double() @ h.T)
    torch_path = _both_ways(x, g, "torch")
    got = _both_ways(x, g, "triton") if triton else torch_path
    vs_fp64 = (_relative(got[0], want[0]), _relative(got[1], want[1]))
    if not triton:
        return Exactness("torch path", rows, vs_fp64)
    pairs = list(zip(got, torch_path, strict=True))
    differing = max((a != b).double().mean().item() for a, b in pairs)
    difference = max(_relative(a, b.double()) for a, b in pairs)
    return Exactness("Triton", rows, vs_fp64, (differing, difference))


def _calls(fn: Callable[[], object], n: int) -> Callable[[], None]:
    def run() -> None:
        for _ in range(n):
            fn()

    return run


def time_per_call(d: int, sizes: FwhtSizes, device: str, backend: str) -> tuple[int, float, float]:
    """(rows, seconds per transform, seconds per copy) of a sizes.speed_bytes bf16 tensor."""
    rows = sizes.speed_bytes // (2 * d)
    x = torch.randn(rows, d, device=device).to(torch.bfloat16)
    out = torch.empty_like(x)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    transform = _calls(lambda: hadamard_transform(x, backend=backend), sizes.calls)
    copy = _calls(lambda: out.copy_(x), sizes.calls)
    per_call = (median_seconds(f, sizes.repeats, sync) / sizes.calls for f in (transform, copy))
    return rows, *per_call


def run(cpu: bool, out: Path) -> list[Check]:
    sizes, device = (CPU, "cpu") if cpu else (GPU, "cuda")
    where = "CPU" if cpu else torch.cuda.get_device_name()
    timed = f"{where}, median of {sizes.repeats} x {sizes.calls} calls"
    checks = []
    for d in sizes.widths:
        if cpu:
            rows, fwht_s, copy_s = time_per_call(d, sizes, device, "torch")
            checks.append(Check(speed_name(d), SPEED_GOAL, "skipped",
                                f"{NO_GPU}; the CPU's torch path took {fwht_s * 1e3:.2f} ms, the "
                                f"copy {copy_s * 1e3:.3f} ms ({rows} x {d} bf16, "
                                f"{memory(sizes.speed_bytes)})"))  # fmt: skip
            continue
        try:
            checks.append(speed_check(d, *time_per_call(d, sizes, device, "triton"), timed))
        except Exception as e:
            checks.append(failed(speed_name(d), SPEED_GOAL, e))
    for d in sizes.exact_widths:
        try:
            m = measure_exactness(d, sizes.exact_rows, device, triton=not cpu)
            checks.append(exact_check(d, m, where))
        except Exception as e:
            checks.append(failed(exact_name(d), EXACT_GOAL, e))
    return checks
