"""The torch path of the Hadamard transform: a few stages of small dense +-1 blocks.

    [alpha *] (scale * (pre * x) @ H_d[^T]) [+ beta]    over the last dimension

Each stage is one block (order <= 64, kernels/sizes.py `torch_plan`) acting on one axis of
the row reshaped as a tensor, a batched matmul: O(d * sum(block orders)) work and a handful
of passes over memory. Accumulation is in fp32 (fp64 for fp64 inputs); the output comes back
in x's dtype. Runs on any device; kernels/triton_fwht.py is the one-pass CUDA kernel.
"""

from __future__ import annotations

from functools import cache

import torch

from scalelab.kernels.blocks import hadamard_block
from scalelab.kernels.sizes import torch_plan


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


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    if dtype == torch.float64:
        return torch.float64
    if dtype in (torch.float32, torch.bfloat16, torch.float16):
        return torch.float32
    raise TypeError(f"hadamard_transform needs a floating-point tensor, got {dtype}")


def _staged(x: torch.Tensor, scale: float, transpose: bool) -> torch.Tensor:
    """scale * x @ H_d (or @ H_d^T), in fp32/fp64, returned in the compute dtype."""
    d = x.shape[-1]
    cdtype = compute_dtype(x.dtype)
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


def torch_fwht(
    x: torch.Tensor,
    scale: float,
    transpose: bool = False,
    *,
    pre: torch.Tensor | None = None,
    alpha: torch.Tensor | None = None,
    beta: torch.Tensor | None = None,
) -> torch.Tensor:
    """[alpha *] (scale * (pre * x) @ H_d[^T]) [+ beta] over the last dim, in x's dtype
    (the same contract as kernels.triton_fwht.triton_fwht; no autograd here)."""
    xin = x if pre is None else x.to(compute_dtype(x.dtype)) * pre
    y = _staged(xin, scale, transpose)
    if alpha is not None:
        y = torch.addcmul(beta.to(y.dtype), alpha.to(y.dtype), y)
    return y.to(x.dtype)
