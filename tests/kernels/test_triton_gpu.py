"""Compiled Triton kernel on a CUDA device against the torch path (skipped without a GPU).

Every supported width by default; SCALELAB_GPU_TEST_WIDTHS (comma-separated widths) keeps
only those, as the GPU acceptance run does (benchmarks/acceptance/gpu_tests.py)."""

import os

import pytest
import torch

from scalelab.kernels import backend as backends
from scalelab.kernels.hadamard import hadamard_transform, hadamard_transform_affine
from scalelab.kernels.sizes import all_supported_sizes

pytestmark = pytest.mark.gpu

DTYPE_TOL = {torch.float32: 1e-5, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}
WIDTHS_VARIABLE = "SCALELAB_GPU_TEST_WIDTHS"


def widths(candidates: list[int]) -> list[int]:
    """The candidates, less those that SCALELAB_GPU_TEST_WIDTHS leaves out when it is set."""
    chosen = os.environ.get(WIDTHS_VARIABLE, "").strip()
    if not chosen:
        return candidates
    keep = {int(w) for w in chosen.split(",")}
    return [d for d in candidates if d in keep]


def _rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@pytest.mark.parametrize("d", widths(all_supported_sizes()))
@pytest.mark.parametrize("dtype", list(DTYPE_TOL))
def test_triton_matches_torch_on_cuda(d, dtype):
    x = torch.randn(37, d, device="cuda").to(dtype).requires_grad_()
    g = torch.randn(37, d, device="cuda").to(dtype)
    y = hadamard_transform(x)  # auto: Triton on CUDA
    (gx,) = torch.autograd.grad(y, x, g)
    y_ref = hadamard_transform(x, backend="torch")
    (gx_ref,) = torch.autograd.grad(y_ref, x, g)
    assert y.dtype == dtype and gx.dtype == dtype
    assert _rel(y, y_ref) < DTYPE_TOL[dtype]
    assert _rel(gx, gx_ref) < DTYPE_TOL[dtype]


@pytest.mark.parametrize("d", widths([768, 1024, 2560, 1792, 4096, 16384]))
@pytest.mark.parametrize("dtype", list(DTYPE_TOL))
def test_fused_affine_matches_torch_on_cuda(d, dtype):
    x = torch.randn(2, 19, d, device="cuda").to(dtype)
    params = [torch.randn(d, device="cuda") for _ in range(2)]
    g = torch.randn(2, 19, d, device="cuda").to(dtype)
    outs = {}
    for backend in ("triton", "torch"):
        leaves = [t.clone().requires_grad_() for t in (x, *params)]
        out = hadamard_transform_affine(*leaves, backend=backend)
        outs[backend] = (out, *torch.autograd.grad(out, leaves, g))
    for got, ref in zip(outs["triton"], outs["torch"], strict=True):
        assert _rel(got, ref) < 2 * DTYPE_TOL[dtype]


@pytest.mark.parametrize("dtype", list(DTYPE_TOL))
def test_auto_keeps_triton_after_its_self_check_on_cuda(dtype):
    """The compiled kernel passes its one-time self-check (kernels/backend.py) in every
    form, so `auto` does not fall back to the torch path on a GPU."""
    backends.forget()
    x = torch.randn(2, 19, 768, device="cuda").to(dtype).requires_grad_()
    alpha, beta = (torch.randn(768, device="cuda", requires_grad=True) for _ in range(2))
    hadamard_transform_affine(x, alpha, beta).float().sum().backward()
    used = backends.used()
    assert used and all(u.backend == "triton" and not u.fallback for u in used.values()), used


@pytest.mark.parametrize("d", widths([768, 1024, 2560]))
def test_the_training_shape_matches_torch_on_cuda(d):
    """A training micro-batch, 8 x 1024 tokens: a row count divisible by 16, unlike the
    self-check's probe (tests/kernels/test_triton_specialisation.py shows both launch the
    same compiled kernel); the affine forward and its gradients match the torch path."""
    backends.forget()
    x = torch.randn(8, 1024, d, device="cuda").to(torch.bfloat16)
    alpha, beta = (torch.randn(d, device="cuda") for _ in range(2))
    g = torch.randn_like(x)
    outs = {}
    for back in ("auto", "torch"):
        leaves = [t.clone().requires_grad_() for t in (x, alpha, beta)]
        out = hadamard_transform_affine(*leaves, backend=back)
        outs[back] = (out, *torch.autograd.grad(out, leaves, g))
    used = backends.used()
    assert used and all(u.backend == "triton" and not u.fallback for u in used.values()), used
    for got, ref in zip(outs["auto"], outs["torch"], strict=True):
        assert _rel(got, ref) < 2 * DTYPE_TOL[torch.bfloat16]
