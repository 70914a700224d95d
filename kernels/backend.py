"""Which kernel computes a Hadamard transform: the Triton kernel or the torch path.

The backend is placement, not identity (`model.hadamard.backend`; docs/architecture.md,
'Hadamard kernels'): both compute the same transform, so the choice never changes a trial id.

- ``torch``: the torch path (kernels/torch_fwht.py), on any device.
- ``triton``: the Triton kernel (kernels/triton_fwht.py). It is checked once per width,
  dtype, device and kernel form (plain, affine, pre-scaled) against the torch path on a
  small probe; a compile failure or a wrong result raises. The probe compiles the very
  kernel that every later call of that kind runs, whatever its row count or the place of
  its data in memory: kernels/triton_fwht.py leaves Triton nothing else to specialise on.
- ``auto``: the Triton kernel for the tensors it serves (`triton_eligible`: CUDA fp32, bf16,
  fp16), after the same one-time check; if the kernel fails to compile or its numbers
  differ, the torch path instead, loudly: a `HadamardBackendWarning` (stderr, so the trial's
  log) and the reason kept in `used()`, which the training job puts on the trial's run
  (tag `scalelab.hadamard_backend` and a line in the log, jobs/training/train.py).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch

from scalelab.kernels.torch_fwht import torch_fwht

BACKENDS = ("auto", "torch", "triton")
TRITON_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# The self-check's largest norm-relative error against the torch path. Both paths sum the
# same +-1 terms in fp32 and round once to the output dtype (a bf16 ulp is 2^-8), so a
# correct kernel is far inside these; a wrong one is off by O(1).
_TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 2.0**-5, torch.float16: 2.0**-8}
_PROBE_ROWS = 5  # not a multiple of any launch's ROWS > 1: the last program is masked


class HadamardBackendWarning(RuntimeWarning):
    """`auto` fell back to the torch path: the Triton kernel failed to compile or its
    self-check."""


@dataclass(frozen=True)
class Use:
    """The kernel that computes one (width, dtype, device) and, after a fallback, why."""

    backend: str  # "triton" or "torch"
    fallback: str = ""  # why auto did not use Triton; "" when nothing failed


# (d, dtype, device, transpose, has pre, has affine, backend) -> the kernel chosen for it
_chosen: dict[tuple, Use] = {}


def triton_eligible(x: torch.Tensor) -> bool:
    """Whether `auto` tries the Triton kernel for x (a seam: tests claim a CPU tensor)."""
    return x.is_cuda and x.dtype in TRITON_DTYPES


def check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"hadamard backend must be one of {BACKENDS}, got {backend!r}")


def run_triton(
    x: torch.Tensor, scale: float, transpose: bool, **affine: torch.Tensor | None
) -> torch.Tensor:
    """The Triton kernel (imported at the first call: triton is heavy)."""
    from scalelab.kernels import triton_fwht

    return triton_fwht.triton_fwht(x, scale, transpose, **affine)


def choose(
    x: torch.Tensor,
    scale: float,
    transpose: bool,
    backend: str,
    pre: torch.Tensor | None,
    alpha: torch.Tensor | None,
    beta: torch.Tensor | None,
) -> str:
    """Which kernel, "triton" or "torch", computes this call; the first call of each kind
    self-checks Triton."""
    key = (x.shape[-1], x.dtype, x.device, transpose, pre is not None, alpha is not None, backend)
    use = _chosen.get(key)
    if use is not None:
        return use.backend
    if backend == "torch" or (backend == "auto" and not triton_eligible(x)):
        use = Use("torch")
    else:
        check_backend(backend)
        problem = _self_check(x, scale, transpose, pre, alpha, beta)
        if problem and backend == "triton":
            raise RuntimeError(
                f"hadamard backend 'triton': {problem} (backend 'auto' would fall back to "
                "the torch path)"
            )
        if problem:
            warnings.warn(
                f"Hadamard transform (width {key[0]}, {x.dtype}, {x.device}): falling back "
                f"to the torch path: {problem}",
                HadamardBackendWarning,
                stacklevel=2,
            )
        use = Use("torch", problem) if problem else Use("triton")
    _chosen[key] = use
    return use.backend


def _self_check(
    x: torch.Tensor,
    scale: float,
    transpose: bool,
    pre: torch.Tensor | None,
    alpha: torch.Tensor | None,
    beta: torch.Tensor | None,
) -> str:
    """Why the Triton kernel must not be used for calls like this one, or "" if it may: it
    runs on a seeded probe of the call's width, dtype, device and form, against torch."""
    d = x.shape[-1]
    gen = torch.Generator().manual_seed(d)

    def like(t: torch.Tensor | None, *shape: int) -> torch.Tensor | None:
        if t is None:
            return None
        return torch.randn(*shape, generator=gen).to(device=t.device, dtype=t.dtype)

    probe = like(x, _PROBE_ROWS, d)
    affine = {"pre": like(pre, d), "alpha": like(alpha, d), "beta": like(beta, d)}
    try:
        got = run_triton(probe, scale, transpose, **affine)
    except Exception as e:  # a compile failure, a missing driver, an unsupported GPU, ...
        first = str(e).strip().splitlines()[0][:300] if str(e).strip() else ""
        return f"the Triton kernel failed: {type(e).__name__}: {first}"
    want = torch_fwht(probe, scale, transpose, **affine).double()
    err = ((got.double() - want).norm() / want.norm().clamp_min(1e-30)).item()
    tol = _TOLERANCE.get(x.dtype, 1e-4)
    if got.shape != probe.shape or got.dtype != probe.dtype or not err <= tol:
        return (
            f"the Triton kernel's self-check against the torch path failed (relative error "
            f"{err:.3g} > {tol:.3g}, or shape/dtype {tuple(got.shape)}/{got.dtype})"
        )
    return ""


def used() -> dict[str, Use]:
    """What computed the transforms of this process so far, by 'width dtype device'; a
    fallback anywhere wins for its label."""
    out: dict[str, Use] = {}
    for (d, dtype, device, *_), use in _chosen.items():
        label = f"{d} {str(dtype).removeprefix('torch.')} {device}"
        if label not in out or (use.fallback and not out[label].fallback):
            out[label] = use
    return out


def forget() -> None:
    """Clear every choice (tests; a later call checks Triton again)."""
    _chosen.clear()
