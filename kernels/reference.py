"""Dense reference transform, x @ H_d, for tests only (O(d^2); never used by the model)."""

from __future__ import annotations

import math

import torch

from scalelab.kernels.blocks import dense_hadamard


def dense_hadamard_matrix(d: int, scale: float | None = None) -> torch.Tensor:
    """scale * H_d as float64; scale defaults to 1/sqrt(d) (orthonormal)."""
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    return torch.tensor(dense_hadamard(d), dtype=torch.float64) * scale


def dense_hadamard_transform(x: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """scale * x @ H_d, computed in float64 and returned in x's dtype."""
    h = dense_hadamard_matrix(x.shape[-1], scale).to(x.device)
    return (x.double() @ h).to(x.dtype)
