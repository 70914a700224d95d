"""The dense baseline's modules at the three seams (their components and counts:
models/dense.py): multi-head self-attention, the dense output projection W_O, and every
token through every block. Attention is causal for language modelling, bidirectional for
the classification encoder, and mixes its heads with the output mixing it is given (dense
W_O here, Hadamard in models/hadamard_layers.py). Dropout acts on the attention
probabilities when `model.dropout_sites` has `attention_probs` (the default); dropout on
the attention's output is the block's (`attention_out`, models/gpt.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch.nn.functional as F
from torch import Tensor, nn

from scalelab.models.context import ForwardContext
from scalelab.models.parametrization import attention_scale

if TYPE_CHECKING:
    from scalelab.models.config import ModelConfig


class DenseOutputProjection(nn.Linear):
    """W_O: the dense d x d mixing of the concatenated heads."""

    width_role = "residual"  # models/parametrization.py: N(0, 0.02^2 / (2 n_layer))

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg.d_model, cfg.d_model, bias=cfg.has_attn_out_bias)


class MultiHeadAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int, out_proj: nn.Module) -> None:
        super().__init__()
        self.n_head, self.d_head = cfg.n_head, cfg.d_head
        self.causal = cfg.causal
        self.dropout = cfg.dropout_at("attention_probs")
        self.scale = attention_scale(cfg)  # None: 1 / sqrt(d_head)
        self.c_attn = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=cfg.has_qkv_bias)
        self.out_proj = out_proj

    def split_heads(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(B, T, d) -> q, k, v each (B, H, T, d_head)."""
        B, T, _ = x.shape
        q, k, v = self.c_attn(x).split(self.n_head * self.d_head, dim=2)
        return tuple(t.view(B, T, self.n_head, self.d_head).transpose(1, 2) for t in (q, k, v))

    def attend(self, q: Tensor, k: Tensor, v: Tensor, ctx: ForwardContext) -> Tensor:
        """Scaled dot-product attention per head: softmax(q k^T / sqrt(d_head)) v (under µP
        the scale is models.parametrization.attention_scale)."""
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
            scale=self.scale,
        )

    def forward(self, x: Tensor, ctx: ForwardContext) -> Tensor:
        return self.out_proj(merge_heads(self.attend(*self.split_heads(x), ctx)))


class FullDepth(nn.Module):
    """Every token goes through every block: the baseline depth routing."""

    def forward(self, x: Tensor, blocks: nn.ModuleList, ctx: ForwardContext) -> Tensor:
        for block in blocks:
            x = block(x, ctx)
        return x


def merge_heads(y: Tensor) -> Tensor:
    """(B, H, T, d_head) -> (B, T, H * d_head)."""
    B, H, T, dh = y.shape
    return y.transpose(1, 2).reshape(B, T, H * dh)
