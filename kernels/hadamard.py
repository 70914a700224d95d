"""Fast orthonormal Walsh-Hadamard transform over the last dimension, with autograd.

    hadamard_transform(x)                 = x @ H_d / sqrt(d)
    hadamard_transform_affine(x, a, b)    = a * (x @ H_d / sqrt(d)) + b

H_d = H_m (x) H_{2^k} (Kronecker), m in {1, 12, 20, 28} (kernels/sizes.py, kernels/blocks.py),
applied as a few stages of small dense +-1 blocks (a radix-16..64 FWHT) instead of the
O(d^2) dense matmul. Two kernels compute it: a Triton kernel for CUDA (kernels/triton_fwht.py)
and the torch path (kernels/torch_fwht.py); kernels/backend.py chooses, per call, with a
one-time self-check of Triton. kernels/reference.py holds the dense x @ H used by the tests.
Accumulation is in fp32 (fp64 for fp64 inputs); outputs come back in the input dtype.

Each transform is a torch custom op (`scalelab::hadamard`, `scalelab::hadamard_affine`, and
`scalelab::hadamard_prescaled` for the affine's input gradient): opaque to torch.compile,
which sees only its output's shape and dtype (the fake implementations) and its gradient
formula, never the block construction or the kernel choice inside. The backward pass is the
transposed transform (Paley type I blocks are not symmetric); the plain transform's backward
is itself differentiable (double backward), the affine's is not.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor
from torch.utils.flop_counter import register_flop_formula

from scalelab.kernels import backend as backends
from scalelab.kernels.sizes import (
    nearest_supported_sizes,
    supported_hadamard_size,
    torch_plan,
    transform_flops,
    unsupported_message,
)
from scalelab.kernels.torch_fwht import compute_dtype, torch_fwht

__all__ = [
    "hadamard_transform",
    "hadamard_transform_affine",
    "supported_hadamard_size",
    "nearest_supported_sizes",
    "torch_plan",
]


def _fwht(
    x: Tensor,
    scale: float,
    transpose: bool,
    backend: str,
    pre: Tensor | None = None,
    alpha: Tensor | None = None,
    beta: Tensor | None = None,
) -> Tensor:
    """Output in x's dtype: [alpha *] (scale * (pre * x) @ H[^T]) [+ beta]."""
    affine = {"pre": pre, "alpha": alpha, "beta": beta}
    if backends.choose(x, scale, transpose, backend, pre, alpha, beta) == "triton":
        return backends.run_triton(x, scale, transpose, **affine)
    return torch_fwht(x, scale, transpose, **affine)


def _like(x: Tensor) -> Tensor:
    """The ops' output: x's shape and dtype, contiguous (what both kernels return)."""
    return x.new_empty(x.shape)


# -- scale * x @ H[^T] --------------------------------------------------------------------
@torch.library.custom_op("scalelab::hadamard", mutates_args=())
def _hadamard(x: Tensor, scale: float, transpose: bool, backend: str) -> Tensor:
    return _fwht(x, scale, transpose, backend)


@_hadamard.register_fake
def _(x: Tensor, scale: float, transpose: bool, backend: str) -> Tensor:
    return _like(x)


def _hadamard_context(ctx: Any, inputs: tuple, output: Tensor) -> None:
    _, ctx.scale, ctx.transpose, ctx.backend = inputs


def _hadamard_backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
    # d/dx of scale * x @ H is scale * grad @ H^T: the transposed transform, the same op,
    # so double backward works too.
    return _hadamard(grad, ctx.scale, not ctx.transpose, ctx.backend), None, None, None


_hadamard.register_autograd(_hadamard_backward, setup_context=_hadamard_context)


# -- scale * (pre * x) @ H^T: the affine's input gradient, H^T (alpha * grad) ---------------
@torch.library.custom_op("scalelab::hadamard_prescaled", mutates_args=())
def _hadamard_prescaled(x: Tensor, pre: Tensor, scale: float, backend: str) -> Tensor:
    return _fwht(x, scale, True, backend, pre=pre)


@_hadamard_prescaled.register_fake
def _(x: Tensor, pre: Tensor, scale: float, backend: str) -> Tensor:
    return _like(x)


# -- alpha * (scale * x @ H) + beta ----------------------------------------------------------
@torch.library.custom_op("scalelab::hadamard_affine", mutates_args=())
def _hadamard_affine(x: Tensor, alpha: Tensor, beta: Tensor, scale: float, backend: str) -> Tensor:
    return _fwht(x, scale, False, backend, alpha=alpha, beta=beta)


@_hadamard_affine.register_fake
def _(x: Tensor, alpha: Tensor, beta: Tensor, scale: float, backend: str) -> Tensor:
    return _like(x)


def _affine_context(ctx: Any, inputs: tuple, output: Tensor) -> None:
    x, alpha, _, ctx.scale, ctx.backend = inputs
    ctx.save_for_backward(x, alpha)


def _affine_backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
    x, alpha = ctx.saved_tensors
    grad_x = grad_alpha = grad_beta = None
    if ctx.needs_input_grad[0]:  # H^T (alpha * grad), alpha fused as a prologue
        grad_x = _hadamard_prescaled(grad, alpha, ctx.scale, ctx.backend)
    cdtype = compute_dtype(grad.dtype)
    g = grad.reshape(-1, grad.shape[-1]).to(cdtype)
    if ctx.needs_input_grad[1]:  # recompute y = H x rather than keep it alive
        y = _hadamard(x, ctx.scale, False, ctx.backend).reshape(g.shape).to(cdtype)
        grad_alpha = (g * y).sum(0).to(alpha.dtype)
    if ctx.needs_input_grad[2]:
        grad_beta = g.sum(0).to(alpha.dtype)
    return grad_x, grad_alpha, grad_beta, None, None


_hadamard_affine.register_autograd(_affine_backward, setup_context=_affine_context)


@register_flop_formula(
    [torch.ops.scalelab.hadamard, torch.ops.scalelab.hadamard_prescaled,
     torch.ops.scalelab.hadamard_affine]
)  # fmt: skip
def _flops(x_shape: torch.Size, *args: Any, **kwargs: Any) -> int:
    """torch's FLOP counter sees each op whole: the staged transform's matmuls per row, as
    models/hadamard.py declares them (the elementwise affine is not counted)."""
    return math.prod(x_shape[:-1]) * transform_flops(x_shape[-1])


# -- the public functions ------------------------------------------------------------------
def _checked(x: Tensor, scale: float | None, backend: str) -> float:
    """The scale, after the width, dtype and backend are checked (clear errors, eagerly)."""
    d = x.shape[-1]
    if not supported_hadamard_size(d):
        raise ValueError(unsupported_message(d))
    compute_dtype(x.dtype)
    backends.check_backend(backend)
    return 1.0 / math.sqrt(d) if scale is None else float(scale)


def hadamard_transform(x: Tensor, scale: float | None = None, *, backend: str = "auto") -> Tensor:
    """``scale * x @ H_d`` over the last dim; ``scale`` defaults to 1/sqrt(d) (orthonormal).

    ``backend``: "auto" (Triton for CUDA fp32/bf16/fp16 once it passes its self-check, torch
    otherwise), "torch" or "triton" (kernels/backend.py). Raises ValueError for a width
    without a Hadamard matrix here.
    """
    return _hadamard(x, _checked(x, scale, backend), False, backend)


def hadamard_transform_affine(
    x: Tensor,
    alpha: Tensor,
    beta: Tensor,
    scale: float | None = None,
    *,
    backend: str = "auto",
) -> Tensor:
    """``alpha * (scale * x @ H_d) + beta`` (alpha, beta of shape (d,)), the Hadamard output
    projection's learned diagonal affine; fused into the Triton kernel on CUDA."""
    scale = _checked(x, scale, backend)
    d = x.shape[-1]
    if alpha.shape != (d,) or beta.shape != (d,):
        raise ValueError(
            f"alpha and beta must have shape ({d},), got {tuple(alpha.shape)}, {tuple(beta.shape)}"
        )
    return _hadamard_affine(x, alpha, beta, scale, backend)
