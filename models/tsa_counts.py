"""TSA's arithmetic (models/tsa.py): the routers' width and the share of token-layer
operations a run skips, for the mechanism's counts, its modules (models/tsa_layers.py),
evaluation and memory planning alike; torch-free."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import Tensor


def tsa_router_hidden(d_model: int) -> int:
    """Router r_l width: a quarter of d_model rounded down, never below 16 (paper: d/4)."""
    return max(16, d_model // 4)


def tlops_saved(alpha: Tensor | float, n_layer: int) -> Tensor | float:
    """Share of token-layer operations skipped: 1 - (1 + (L-1) alpha) / L."""
    return 1.0 - (1.0 + (n_layer - 1) * alpha) / n_layer
