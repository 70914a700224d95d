"""Multi-head self-attention with all heads (the baseline head selection).

Causal for language modelling, bidirectional for the classification encoder; the output
mixing W_O is a pluggable component (dense here, Hadamard in models/hadamard.py).
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from models.components import build_output_mixer
from models.config import ModelConfig
from models.context import ForwardContext


class DenseOutputProjection(nn.Linear):
    """W_O: the dense d x d mixing of the concatenated heads."""

    is_residual_projection = True  # initialised at 0.02 / sqrt(2 * n_layer)

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg.d_model, cfg.d_model, bias=cfg.bias)


class MultiHeadAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.n_head, self.d_head = cfg.n_head, cfg.d_head
        self.causal = cfg.causal
        self.dropout = cfg.dropout
        self.c_attn = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=cfg.bias)
        self.out_proj = build_output_mixer(cfg)
        self.resid_dropout = nn.Dropout(cfg.dropout)

    def split_heads(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(B, T, d) -> q, k, v each (B, H, T, d_head)."""
        B, T, _ = x.shape
        q, k, v = self.c_attn(x).split(self.n_head * self.d_head, dim=2)
        return tuple(t.view(B, T, self.n_head, self.d_head).transpose(1, 2) for t in (q, k, v))

    def attend(self, q: Tensor, k: Tensor, v: Tensor, ctx: ForwardContext) -> Tensor:
        """Scaled dot-product attention per head: softmax(q k^T / sqrt(d_head)) v."""
        mask = None
        if ctx.pad_mask is not None:  # encoder with padding: never attend to padded keys
            mask = ctx.pad_mask[:, None, None, :]
        return F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=mask,
            is_causal=self.causal and mask is None,
            dropout_p=self.dropout if self.training else 0.0,
        )

    def forward(self, x: Tensor, ctx: ForwardContext) -> Tensor:
        y = merge_heads(self.attend(*self.split_heads(x), ctx))
        return self.resid_dropout(self.out_proj(y))


def merge_heads(y: Tensor) -> Tensor:
    """(B, H, T, d_head) -> (B, T, H * d_head)."""
    B, H, T, dh = y.shape
    return y.transpose(1, 2).reshape(B, T, H * dh)
