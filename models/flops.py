"""Analytic parameter and FLOP counts per token, per mechanism (torch-free).

Conventions (Kaplan et al. 2020; Hoffmann et al. 2022, App. F):
- a multiply-add is 2 FLOPs; layer norms, biases, GELU and softmax are not counted;
- attention scores and the weighted sum over values count the full T x T matrix
  (2 * T * d each per token), as SDPA computes it and as torch's FlopCounterMode counts it;
- training = forward + backward = 3x the forward FLOPs. The Hadamard mixing counts the
  staged transform as executed (kernels.sizes.transform_flops: a few dense +-1 blocks of
  order <= 64, 2*d*sum(orders) per token rather than the ideal d*log2(d) additions); its
  backward runs the transposed transform for the input gradient and recomputes the
  forward for alpha's, so it too costs 2x its forward;
- "active" fractions describe what inference actually executes: BudgetFormer's mean k/H of
  heads and TSA's fraction of token-layer FFN passes. Soft training executes everything.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from kernels.sizes import transform_flops
from models.config import ModelConfig


@dataclass(frozen=True)
class ActiveFractions:
    heads: float = 1.0  # BudgetFormer: mean k/H of heads computed
    ffn_tokens: float = 1.0  # TSA: share of token passes through the FFN in routed blocks


@dataclass(frozen=True)
class FlopCount:
    """FLOPs per token of one forward pass, by part."""

    attention_qkv: float
    attention_context: float
    attention_out: float  # dense W_O (matmul) ...
    hadamard_mixing: float  # ... or the staged Walsh-Hadamard transform (small block matmuls)
    mlp: float
    mechanisms: float  # budget / relevance nets, TSA routers (matmul)
    head: float  # LM head (or classifier, per token)

    @property
    def total(self) -> float:
        return sum(getattr(self, f.name) for f in fields(self))

    @property
    def matmul(self) -> float:
        """Every counted part runs as a matrix multiply (elementwise work is not counted)."""
        return self.total


def count_params(cfg: ModelConfig, non_embedding: bool = False) -> int:
    """Exact parameter count of models.build(cfg) (tied embeddings counted once)."""
    d, L, b = cfg.d_model, cfg.n_layer, int(cfg.bias)
    norm = d * (1 + b)
    out_mix = 2 * d if cfg.attn_out == "hadamard" else d * d + d * b
    block = 2 * norm + (3 * d * d + 3 * d * b) + out_mix + (8 * d * d + 5 * d * b)
    n = L * (block + _budget_params_per_layer(cfg)) + norm + _tsa_params(cfg)
    if cfg.task == "classify":
        n += d * cfg.n_classes + cfg.n_classes * b
    if not non_embedding:
        n += cfg.vocab_size * d + cfg.block_size * d
    return n


def _budget_params_per_layer(cfg: ModelConfig) -> int:
    if cfg.budget is None:
        return 0
    d, h = cfg.d_model, cfg.budget.budget_hidden
    budget_net = d * h + h + h + 1  # f_theta: d -> h -> 1
    relevance_net = d * cfg.n_head + cfg.n_head  # g_phi: d -> H
    return budget_net + relevance_net


def _tsa_params(cfg: ModelConfig) -> int:
    from models.tsa import tsa_router_hidden

    if cfg.tsa is None:
        return 0
    d, r = cfg.d_model, tsa_router_hidden(cfg.d_model)
    return (cfg.n_layer - 1) * (d * r + r + r + 1)  # routers r_0 .. r_{L-2}: d -> r -> 1


def forward_flops_per_token(
    cfg: ModelConfig, seq_len: int | None = None, active: ActiveFractions | None = None
) -> FlopCount:
    """Forward FLOPs per token at context `seq_len` (default: the model's block_size)."""
    active = active or ActiveFractions()
    d, L, T = cfg.d_model, cfg.n_layer, seq_len or cfg.block_size
    heads = active.heads if cfg.budget is not None else 1.0
    ffn = active.ffn_tokens if cfg.tsa is not None else 1.0
    routed_blocks = L - 1 if cfg.tsa is not None else 0  # block 0 always runs in full
    mlp_passes = (L - routed_blocks) + routed_blocks * ffn
    if cfg.attn_out == "hadamard":
        out_mix, hadamard = 0.0, L * transform_flops(d)
    else:
        out_mix, hadamard = L * 2 * d * d * heads, 0.0
    from models.budget import budget_net_flops
    from models.tsa import tsa_router_hidden

    mechanisms = 0.0
    if cfg.budget is not None:  # one decision per token (decoder) or per sequence (encoder)
        mechanisms += L * budget_net_flops(cfg) * (1.0 if cfg.causal else 1.0 / T)
    if cfg.tsa is not None:  # routers run for every token (they decide), biases not counted
        r = tsa_router_hidden(d)
        mechanisms += (L - 1) * 2 * (d * r + r)
    head = 2 * d * cfg.vocab_size if cfg.task == "lm" else 2 * d * cfg.n_classes / T
    return FlopCount(
        attention_qkv=L * 6 * d * d * heads,
        attention_context=L * 4 * T * d * heads,
        attention_out=out_mix,
        hadamard_mixing=hadamard,
        mlp=mlp_passes * 16 * d * d,
        mechanisms=mechanisms,
        head=head,
    )


def train_flops_per_token(cfg: ModelConfig, seq_len: int | None = None) -> float:
    """Training FLOPs per token (forward + backward) of soft training: every part runs."""
    fwd = forward_flops_per_token(cfg, seq_len)
    return 3 * fwd.total
