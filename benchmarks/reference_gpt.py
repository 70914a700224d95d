"""An independent reference GPT for the baseline-parity benchmark (benchmarks/baseline_parity.py).

Written from the standard recipe, not from scalelab's model: a pre-norm decoder with
learned positions, tied input/output embeddings, a 4x GELU FFN and causal SDPA attention.
`Recipe` holds every choice in which scalelab's baseline differed from this recipe (issue
19), so each one can be flipped alone:

- init: 'fan_in' keeps PyTorch's nn.Linear default for the QKV and the first FFN layer
  (uniform, variance 1/(3 fan_in): std 0.051 at d 128); 'fixed' draws them N(0, 0.02)
  whatever the width. Residual output projections are N(0, 0.02/sqrt(2L)), embeddings
  N(0, 0.02), biases zero in both.
- decay_embeddings: AdamW weight decay on wte / wpe (and so the tied head) or not; biases
  and LayerNorm gains never decay.
- attn_bias: biases in the QKV and attention output projections (the FFN keeps its biases).
- dropout: 'ffn_hidden' drops the FFN hidden layer (after the activation); 'sublayer_out'
  drops the attention and FFN outputs before the residual add. Both also drop the
  embedding sum and the attention probabilities.
- router (TSA only): 'relu_default' is a Linear-ReLU-Linear router with PyTorch's default
  init; 'gelu_small' uses GELU and N(0, 0.02) weights. Both start with output bias -1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn


@dataclass(frozen=True)
class Recipe:
    init: Literal["fan_in", "fixed"] = "fan_in"
    decay_embeddings: bool = False
    attn_bias: bool = False
    dropout: Literal["ffn_hidden", "sublayer_out"] = "ffn_hidden"
    router: Literal["relu_default", "gelu_small"] = "relu_default"

    @staticmethod
    def scalelab_v1() -> Recipe:
        """scalelab's defaults before issue 19 (semantics versions 1 and 2)."""
        return Recipe("fixed", True, True, "sublayer_out", "gelu_small")

    def but(self, **changes: object) -> Recipe:
        return replace(self, **changes)


@dataclass(frozen=True)
class Shape:
    vocab: int = 256
    context: int = 128
    d: int = 128
    layers: int = 6
    heads: int = 4
    dropout: float = 0.1
    tsa: bool = False  # routers between blocks, soft gates, lambda = 0


class SelfAttention(nn.Module):
    def __init__(self, s: Shape, r: Recipe) -> None:
        super().__init__()
        self.heads, self.p, self.recipe = s.heads, s.dropout, r
        self.c_attn = nn.Linear(s.d, 3 * s.d, bias=r.attn_bias)
        self.out_proj = nn.Linear(s.d, s.d, bias=r.attn_bias)
        self.drop = nn.Dropout(s.dropout)

    def forward(self, x: Tensor) -> Tensor:
        B, T, d = x.shape
        q, k, v = (
            t.view(B, T, self.heads, d // self.heads).transpose(1, 2)
            for t in self.c_attn(x).chunk(3, dim=-1)
        )
        y = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, dropout_p=self.p if self.training else 0.0
        )
        y = self.out_proj(y.transpose(1, 2).reshape(B, T, d))
        return self.drop(y) if self.recipe.dropout == "sublayer_out" else y


class FeedForward(nn.Module):
    def __init__(self, s: Shape, r: Recipe) -> None:
        super().__init__()
        self.recipe = r
        self.c_fc = nn.Linear(s.d, 4 * s.d)
        self.c_proj = nn.Linear(4 * s.d, s.d)
        self.drop = nn.Dropout(s.dropout)

    def forward(self, x: Tensor) -> Tensor:
        h = F.gelu(self.c_fc(x))
        if self.recipe.dropout == "ffn_hidden":
            h = self.drop(h)
        y = self.c_proj(h)
        return self.drop(y) if self.recipe.dropout == "sublayer_out" else y


class Block(nn.Module):
    def __init__(self, s: Shape, r: Recipe) -> None:
        super().__init__()
        self.ln_1, self.attn = nn.LayerNorm(s.d), SelfAttention(s, r)
        self.ln_2, self.mlp = nn.LayerNorm(s.d), FeedForward(s, r)

    def forward(self, x: Tensor, gate: Tensor | float = 1.0) -> Tensor:
        x = x + gate * self.attn(self.ln_1(x))
        return x + gate * self.mlp(self.ln_2(x))


class Router(nn.Module):
    def __init__(self, d: int, r: Recipe) -> None:
        super().__init__()
        self.fc, self.out = nn.Linear(d, max(16, d // 4)), nn.Linear(max(16, d // 4), 1)
        self.act = nn.ReLU() if r.router == "relu_default" else nn.GELU()
        if r.router == "gelu_small":
            for layer in (self.fc, self.out):
                nn.init.normal_(layer.weight, std=0.02)
                nn.init.zeros_(layer.bias)
        nn.init.constant_(self.out.bias, -1.0)

    def forward(self, x: Tensor) -> Tensor:
        return torch.sigmoid(self.out(self.act(self.fc(x))))  # (B, T, 1): halt probability


class ReferenceGPT(nn.Module):
    def __init__(self, s: Shape, r: Recipe) -> None:
        super().__init__()
        self.shape, self.recipe = s, r
        self.wte, self.wpe = nn.Embedding(s.vocab, s.d), nn.Embedding(s.context, s.d)
        self.drop = nn.Dropout(s.dropout)
        self.blocks = nn.ModuleList(Block(s, r) for _ in range(s.layers))
        self.ln_f = nn.LayerNorm(s.d)
        self.routers = nn.ModuleList(Router(s.d, r) for _ in range(s.layers - 1)) if s.tsa else None
        self._init()

    def _init(self) -> None:
        s, r = self.shape, self.recipe
        for emb in (self.wte, self.wpe):
            nn.init.normal_(emb.weight, std=0.02)
        for block in self.blocks:
            for layer in (block.attn.c_attn, block.mlp.c_fc):  # 'fan_in': PyTorch's default
                if r.init == "fixed":
                    nn.init.normal_(layer.weight, std=0.02)
            for layer in (block.attn.out_proj, block.mlp.c_proj):
                nn.init.normal_(layer.weight, std=0.02 / math.sqrt(2 * s.layers))
            for layer in (block.attn.c_attn, block.attn.out_proj, block.mlp.c_fc, block.mlp.c_proj):
                if layer.bias is not None:
                    nn.init.zeros_(layer.bias)

    def forward(self, idx: Tensor, targets: Tensor) -> Tensor:
        T = idx.size(1)
        x = self.drop(self.wte(idx) + self.wpe(torch.arange(T, device=idx.device)))
        for i, block in enumerate(self.blocks):
            gate = 1.0 if i == 0 or self.routers is None else 1.0 - self.routers[i - 1](x)
            x = block(x, gate)
        logits = self.ln_f(x) @ self.wte.weight.t()  # tied head
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())

    def param_groups(self, weight_decay: float) -> list[dict]:
        """Decay Linear weights; never biases or norms; embeddings only if the recipe says."""
        embeddings = {id(self.wte.weight), id(self.wpe.weight)}
        decay, keep = [], []
        for p in self.parameters():
            if p.dim() >= 2 and (id(p) not in embeddings or self.recipe.decay_embeddings):
                decay.append(p)
            else:
                keep.append(p)
        return [
            {"params": decay, "weight_decay": weight_decay},
            {"params": keep, "weight_decay": 0.0},
        ]
