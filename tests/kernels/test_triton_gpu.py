"""Compiled Triton kernel on a CUDA device against the torch path (skipped without a GPU)."""

import pytest
import torch

from scalelab.kernels.hadamard import hadamard_transform, hadamard_transform_affine
from scalelab.kernels.sizes import all_supported_sizes

pytestmark = pytest.mark.gpu

DTYPE_TOL = {torch.float32: 1e-5, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}


def _rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@pytest.mark.parametrize("d", all_supported_sizes())
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


@pytest.mark.parametrize("d", [768, 1024, 2560, 1792, 4096, 16384])
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
    from scalelab.kernels import backend

    backend.forget()
    x = torch.randn(2, 19, 768, device="cuda").to(dtype).requires_grad_()
    alpha, beta = (torch.randn(768, device="cuda", requires_grad=True) for _ in range(2))
    hadamard_transform_affine(x, alpha, beta).float().sum().backward()
    used = backend.used()
    assert used and all(u.backend == "triton" and not u.fallback for u in used.values()), used
