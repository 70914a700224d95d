"""BudgetFormer's FLOP counts (models/budget.py): the budget and relevance nets, and the
attention a layer's hard (inference) path executes for its head decisions. models/flops.py
sums the model; these are the budget-specific terms. Torch- and numpy-free to import: the
mechanism's declaration counts with it when a sweep is planned."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from scalelab.models.mechanism import Seam

if TYPE_CHECKING:
    from scalelab.models.config import ModelConfig


def budget_net_flops(cfg: ModelConfig) -> int:
    """f_theta (d -> h -> 1) and g_phi (d -> H) on one pooled vector (matmul FLOPs)."""
    d, h = cfg.d_model, cfg.budget.budget_hidden
    return 2 * (d * h + h + d * cfg.n_head)


def budget_inference_flops(
    cfg: ModelConfig, k: Sequence, seq_len: int, union: Sequence | None = None
) -> float:
    """Matmul FLOPs of the attention layers (Q/K/V, scores and values, dense W_O, budget and
    relevance nets) that BudgetFormer's inference executes for one batch, from the actual
    decisions: `k[l]` is layer l's heads per example, shape (B,) or (B, 1) for the encoder,
    (B, T) per query token for the decoder; `union[l]` (B,) counts the heads whose K/V the
    decoder computed (models.budget_layers.budget_decisions returns both). The Hadamard
    transform runs over all d channels and is counted in forward_flops_per_token, not here.
    Attention rows count all T keys, as for full attention (FlopCounterMode's convention
    for is_causal); the decoder's chunked pair attention computes fewer for T >= 256."""
    import numpy as np

    total = 0.0
    for layer, k_l in enumerate(k):
        u = None if union is None else np.asarray(union[layer], dtype=np.float64)
        total += float(budget_layer_flops(cfg, np.asarray(k_l, dtype=np.float64), seq_len, u))
    return total


@dataclass(frozen=True)
class LayerFlopTerms:
    """What `budget_layer_flops` reads from the model config, read once: a layer's forward
    reads these plain ints, which torch.compile traces without breaking its graph (it
    cannot trace a pydantic config's attribute lookup)."""

    d: int
    dh: int
    head_mixing: int  # the output mixing's share of one (query, head) pair
    net: int  # budget_net_flops
    causal: bool

    @classmethod
    def of(cls, cfg: ModelConfig) -> LayerFlopTerms:
        mixing = cfg.component(Seam.OUTPUT_MIXING).selected_head_flops(cfg)
        return cls(cfg.d_model, cfg.d_head, mixing, budget_net_flops(cfg), cfg.causal)

    def flops(self, k: Any, seq_len: int, union: Any = None) -> Any:
        d, dh, T = self.d, self.dh, seq_len
        per_pair = 2 * d * dh + 4 * T * dh + self.head_mixing  # Q row, one attention row
        B = k.shape[0]
        if self.causal:
            pairs, kv_heads, decisions = k.sum(), union.sum(), B * T
        else:
            pairs, kv_heads, decisions = k.sum() * T, k.sum(), B
        return pairs * per_pair + kv_heads * T * 4 * d * dh + decisions * self.net


def budget_layer_flops(cfg: ModelConfig, k: Any, seq_len: int, union: Any = None) -> Any:
    """`budget_inference_flops` of one layer; k and union are numpy arrays or tensors (the
    result has the same kind, so a training step can log it without a host sync)."""
    return LayerFlopTerms.of(cfg).flops(k, seq_len, union)
