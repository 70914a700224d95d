"""Fast orthonormal Walsh-Hadamard transform over the last dimension, with autograd.

    hadamard_transform(x)                 = x @ H_d / sqrt(d)
    hadamard_transform_affine(x, a, b)    = a * (x @ H_d / sqrt(d)) + b

H_d = H_m (x) H_{2^k} (Kronecker), m in {1, 12, 20, 28} (kernels/sizes.py, kernels/blocks.py).
The transform is applied as a few stages, each a small dense +-1 block (order <= 64) acting on
one axis of the row reshaped as a tensor (a radix-16..64 FWHT): O(d * sum(block orders))
work and a handful of passes over memory, instead of the O(d^2) dense matmul.

Dispatch: a Triton kernel (kernels/triton_fwht.py) for fp32/bf16/fp16 CUDA tensors, this
torch implementation elsewhere; kernels/reference.py holds the dense x @ H used by the tests.
Accumulation is in fp32 (fp64 for fp64 inputs); outputs come back in the input dtype.
The backward pass is the transposed transform (Paley type I blocks are not symmetric).
"""

from __future__ import annotations

import math
from functools import cache
from typing import Any

import torch

from scalelab.kernels.blocks import hadamard_block
from scalelab.kernels.sizes import (
    nearest_supported_sizes,
    supported_hadamard_size,
    torch_plan,
    unsupported_message,
)

__all__ = [
    "hadamard_transform",
    "hadamard_transform_affine",
    "supported_hadamard_size",
    "nearest_supported_sizes",
]

_BACKENDS = ("auto", "torch", "triton")


def _block(order: int, m: int) -> torch.Tensor:
    """Unnormalised H_m (x) H_{order/m} as a float64 tensor."""
    h = torch.tensor(hadamard_block(m), dtype=torch.float64)
    return torch.kron(h, torch.tensor(hadamard_block(order // m), dtype=torch.float64))


@cache
def _stage_matrices(
    d: int, device: torch.device, dtype: torch.dtype, transpose: bool
) -> tuple[torch.Tensor, ...]:
    blocks = (_block(order, m) for order, m in torch_plan(d))
    return tuple((b.T if transpose else b).contiguous().to(device, dtype) for b in blocks)


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    if dtype == torch.float64:
        return torch.float64
    if dtype in (torch.float32, torch.bfloat16, torch.float16):
        return torch.float32
    raise TypeError(f"hadamard_transform needs a floating-point tensor, got {dtype}")


def _torch_fwht(x: torch.Tensor, scale: float, transpose: bool) -> torch.Tensor:
    """scale * x @ H_d (or @ H_d^T), in fp32/fp64, returned in the compute dtype."""
    d = x.shape[-1]
    cdtype = _compute_dtype(x.dtype)
    mats = _stage_matrices(d, x.device, cdtype, transpose)
    y = x.reshape(-1, d).to(cdtype)
    rows = y.shape[0]
    if not mats or rows == 0:  # d == 1, or no rows at all
        return (y * scale).reshape(x.shape)
    pre = rows
    for i, g in enumerate(mats):
        f = g.shape[0]
        if i == len(mats) - 1:
            g = g * scale  # fold the normalisation into the last (smallest-work) step
        post = d * rows // (pre * f)
        if post == 1:
            y = y.reshape(-1, f) @ g
        else:  # y[p, c, q] = sum_a y[p, a, q] g[a, c]
            y = torch.matmul(g.T, y.reshape(pre, f, post))
        pre *= f
    return y.reshape(x.shape)


def _use_triton(x: torch.Tensor, backend: str) -> bool:
    if backend not in _BACKENDS:
        raise ValueError(f"backend must be one of {_BACKENDS}, got {backend!r}")
    if backend == "auto":
        return x.is_cuda and x.dtype in (torch.float32, torch.bfloat16, torch.float16)
    return backend == "triton"


def _check_width(x: torch.Tensor) -> int:
    d = x.shape[-1]
    if not supported_hadamard_size(d):
        raise ValueError(unsupported_message(d))
    return d


def _fwht(
    x: torch.Tensor,
    scale: float,
    transpose: bool,
    backend: str,
    pre: torch.Tensor | None = None,
    alpha: torch.Tensor | None = None,
    beta: torch.Tensor | None = None,
) -> torch.Tensor:
    """Output in x's dtype: [alpha *] (scale * (pre * x) @ H[^T]) [+ beta]."""
    if _use_triton(x, backend):
        from scalelab.kernels.triton_fwht import triton_fwht  # imported lazily: triton is heavy

        return triton_fwht(x, scale, transpose, pre=pre, alpha=alpha, beta=beta)
    xin = x if pre is None else x.to(_compute_dtype(x.dtype)) * pre
    y = _torch_fwht(xin, scale, transpose)
    if alpha is not None:
        y = torch.addcmul(beta.to(y.dtype), alpha.to(y.dtype), y)
    return y.to(x.dtype)


class _Hadamard(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, scale: float, transpose: bool, backend: str
    ) -> torch.Tensor:
        ctx.scale, ctx.transpose, ctx.backend = scale, transpose, backend
        return _fwht(x, scale, transpose, backend)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        # d/dx of scale * x @ H is scale * grad @ H^T: the transposed transform, itself
        # differentiable, so double backward works too.
        return _Hadamard.apply(grad, ctx.scale, not ctx.transpose, ctx.backend), None, None, None


class _HadamardAffine(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        alpha: torch.Tensor,
        beta: torch.Tensor,
        scale: float,
        backend: str,
    ) -> torch.Tensor:
        ctx.scale, ctx.backend = scale, backend
        ctx.save_for_backward(x, alpha)
        return _fwht(x, scale, False, backend, alpha=alpha, beta=beta)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, alpha = ctx.saved_tensors
        grad_x = grad_alpha = grad_beta = None
        if ctx.needs_input_grad[0]:  # H^T (alpha * grad), alpha fused as a prologue
            grad_x = _fwht(grad, ctx.scale, True, ctx.backend, pre=alpha)
        cdtype = _compute_dtype(grad.dtype)
        g = grad.reshape(-1, grad.shape[-1]).to(cdtype)
        if ctx.needs_input_grad[1]:  # recompute y = H x rather than keep it alive
            y = _fwht(x, ctx.scale, False, ctx.backend).reshape(g.shape).to(cdtype)
            grad_alpha = (g * y).sum(0).to(alpha.dtype)
        if ctx.needs_input_grad[2]:
            grad_beta = g.sum(0).to(alpha.dtype)
        return grad_x, grad_alpha, grad_beta, None, None


def hadamard_transform(
    x: torch.Tensor, scale: float | None = None, *, backend: str = "auto"
) -> torch.Tensor:
    """``scale * x @ H_d`` over the last dim; ``scale`` defaults to 1/sqrt(d) (orthonormal).

    ``backend``: "auto" (Triton for CUDA fp32/bf16/fp16, torch otherwise), "torch" or
    "triton". Raises ValueError for a width without a Hadamard matrix here.
    """
    d = _check_width(x)
    _compute_dtype(x.dtype)
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    return _Hadamard.apply(x, scale, False, backend)


def hadamard_transform_affine(
    x: torch.Tensor,
    alpha: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    *,
    backend: str = "auto",
) -> torch.Tensor:
    """``alpha * (scale * x @ H_d) + beta`` (alpha, beta of shape (d,)), the Hadamard output
    projection's learned diagonal affine; fused into the Triton kernel on CUDA."""
    d = _check_width(x)
    _compute_dtype(x.dtype)
    if alpha.shape != (d,) or beta.shape != (d,):
        raise ValueError(
            f"alpha and beta must have shape ({d},), got {tuple(alpha.shape)}, {tuple(beta.shape)}"
        )
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    return _HadamardAffine.apply(x, alpha, beta, scale, backend)
