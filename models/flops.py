"""Analytic parameter and FLOP counts per token: the backbone's terms plus what each seam's
component (models/mechanism.py) declares (torch-free to import; a mechanism's own module is
loaded when its config is).

Conventions (Kaplan et al. 2020; Hoffmann et al. 2022, App. F):
- a multiply-add is 2 FLOPs; layer norms, biases, GELU and softmax are not counted;
- attention scores and the weighted sum over values count the full T x T matrix
  (2 * T * d each per token), as SDPA computes it and as torch's FlopCounterMode counts it.
  This is the compute budget's and the scaling fits' convention (train_flops_per_token;
  trial ids and budgets depend on it). A causal model's query t attends to t + 1 keys,
  (T + 1) / 2 on average, which is what a causal kernel (flash attention) executes:
  train_flops_per_token_causal counts that, for the MFU a GPU achieves (perf/mfu_causal);
- training = forward + backward = 3x the forward FLOPs. The Hadamard mixing counts the
  staged transform as executed (kernels.sizes.transform_flops: a few dense +-1 blocks of
  order <= 64, 2*d*sum(orders) per token rather than the ideal d*log2(d) additions); its
  backward runs the transposed transform for the input gradient and recomputes the
  forward for alpha's, so it too costs 2x its forward;
- "active" fractions describe what inference actually executes: BudgetFormer's mean k/H of
  heads and TSA's fraction of token-layer FFN passes. Soft training executes everything.
"""

from __future__ import annotations

from scalelab.models.config import ModelConfig
from scalelab.models.mechanism import ActiveFractions, Component, FlopCount, Seam

__all__ = [
    "ActiveFractions",
    "FlopCount",
    "count_params",
    "forward_flops_per_token",
    "train_flops_per_token",
    "train_flops_per_token_causal",
]


def count_params(cfg: ModelConfig, non_embedding: bool = False) -> int:
    """Exact parameter count of models.build(cfg) (tied embeddings counted once)."""
    d, L, b = cfg.d_model, cfg.n_layer, int(cfg.bias)
    qkv_b, ffn_b = int(cfg.has_qkv_bias), int(cfg.has_ffn_bias)
    norm = d * (1 + b)
    block = 2 * norm + (3 * d * d + 3 * d * qkv_b) + (8 * d * d + 5 * d * ffn_b)  # norms, QKV, MLP
    n = L * block + norm + sum(c.params(cfg) for c in _components(cfg))
    if cfg.task == "classify":
        n += d * cfg.n_classes + cfg.n_classes * b
    if not non_embedding:
        n += cfg.vocab_size * d + cfg.block_size * d
    return n


def forward_flops_per_token(
    cfg: ModelConfig, seq_len: int | None = None, active: ActiveFractions | None = None
) -> FlopCount:
    """Forward FLOPs per token at context `seq_len` (default: the model's block_size)."""
    active = active or ActiveFractions()
    d, L, T = cfg.d_model, cfg.n_layer, seq_len or cfg.block_size
    mixing, selection, depth = _components(cfg)
    heads = selection.heads(cfg, active)
    resolved = ActiveFractions(heads=heads, ffn_tokens=active.ffn_tokens)
    head = 2 * d * cfg.vocab_size if cfg.task == "lm" else 2 * d * cfg.n_classes / T
    backbone = FlopCount(
        attention_qkv=L * 6 * d * d * heads,
        attention_context=L * 4 * T * d * heads,
        mlp=depth.mlp_passes(cfg, active) * 16 * d * d,
        head=head,
    )
    parts = [c.forward_flops(cfg, T, resolved) for c in (mixing, selection, depth)]
    return backbone + parts[0] + parts[1] + parts[2]


def _components(cfg: ModelConfig) -> tuple[Component, Component, Component]:
    """What sits at each seam: output mixing, head selection, depth routing."""
    return tuple(
        cfg.component(s) for s in (Seam.OUTPUT_MIXING, Seam.HEAD_SELECTION, Seam.DEPTH_ROUTING)
    )


def train_flops_per_token(cfg: ModelConfig, seq_len: int | None = None) -> float:
    """Training FLOPs per token (forward + backward) of soft training: every part runs."""
    fwd = forward_flops_per_token(cfg, seq_len)
    return 3 * fwd.total


def train_flops_per_token_causal(cfg: ModelConfig, seq_len: int | None = None) -> float:
    """train_flops_per_token with attention counted over the causal triangle: query t of T
    attends to t + 1 keys, so the scores and the weighted sum cost (T + 1) / (2 T) of the
    full T x T count. An encoder (model.causal False) attends to all T: the full count."""
    fwd = forward_flops_per_token(cfg, seq_len)
    if not cfg.causal:
        return 3 * fwd.total
    T = seq_len or cfg.block_size
    return 3 * (fwd.total - fwd.attention_context * (T - 1) / (2 * T))
