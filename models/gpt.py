"""The GPT backbone (nanoGPT's model, with three seams for the efficiency mechanisms:
models/mechanism.py; each seam's module comes from `ModelConfig.component`).

Pre-norm blocks, causal SDPA attention, a 4x GELU MLP, learned positional embeddings and
tied input/output embeddings. With `task='classify'` the same stack runs as a
bidirectional encoder with a mean-pooled classification head. Dropout acts at
`model.dropout_sites`: by default the embedding sum, the attention probabilities and the
MLP's hidden layer (scalelab's choice, docs/reproducing/baseline.md; each paper's authors'
layout, which differs: docs/reproducing/*.md). Init and per-layer learning rates:
models/parametrization.py.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from scalelab.models.config import ModelConfig
from scalelab.models.context import ForwardContext, ModelOutput, masked_mean
from scalelab.models.mechanism import Seam
from scalelab.models.parametrization import init_module, logit_scale, set_role


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        d, bias = cfg.d_model, cfg.has_ffn_bias
        self.c_fc = nn.Linear(d, 4 * d, bias=bias)
        self.gelu = nn.GELU()
        self.c_proj = set_role(nn.Linear(4 * d, d, bias=bias), "residual")
        self.dropout = nn.Dropout(cfg.dropout_at("ffn_hidden"))
        self.out_dropout = _dropout(cfg, "ffn_out")

    def forward(self, x: Tensor) -> Tensor:
        return self.out_dropout(self.c_proj(self.dropout(self.gelu(self.c_fc(x)))))


def _dropout(cfg: ModelConfig, site: str) -> nn.Module:
    """Dropout at a site that is off by default: Identity when off, so the default model's
    modules (and its random stream) are what they were before the site existed."""
    p = cfg.dropout_at(site)
    return nn.Dropout(p) if p > 0 else nn.Identity()


class Block(nn.Module):
    """x + Attn(LN(x)), then + MLP(LN(x)); the two residual updates are exposed separately
    so depth routing can gate or skip them per token."""

    def __init__(self, cfg: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.d_model, bias=cfg.bias)
        out_proj = cfg.component(Seam.OUTPUT_MIXING).build(cfg, layer_idx)
        self.attn = cfg.component(Seam.HEAD_SELECTION).build(cfg, layer_idx, out_proj)
        self.attn_dropout = _dropout(cfg, "attention_out")
        self.ln_2 = nn.LayerNorm(cfg.d_model, bias=cfg.bias)
        self.mlp = MLP(cfg)

    def attn_update(self, x: Tensor, ctx: ForwardContext) -> Tensor:
        return self.attn_dropout(self.attn(self.ln_1(x), ctx))

    def mlp_update(self, x: Tensor) -> Tensor:
        return self.mlp(self.ln_2(x))

    def forward(self, x: Tensor, ctx: ForwardContext) -> Tensor:
        x = x + self.attn_update(x, ctx)
        return x + self.mlp_update(x)


class GPT(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        # The constructors' random values are all replaced by init_weights; keeping their
        # draws out of the RNG stream makes the initial values depend on the caller's seed
        # only, so a model built on the meta device and materialised module by module
        # (models.build.build_materialised) gets the same values.
        with torch.random.fork_rng(devices=[]):
            self.wte = nn.Embedding(cfg.vocab_size, cfg.d_model)
            self.wpe = nn.Embedding(cfg.block_size, cfg.d_model)
            self.drop = nn.Dropout(cfg.dropout_at("embedding"))
            self.blocks = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layer))
            self.depth = cfg.component(Seam.DEPTH_ROUTING).build(cfg)
            self.ln_f = nn.LayerNorm(cfg.d_model, bias=cfg.bias)
            if cfg.task == "lm":
                # tied input/output embeddings: the weight is the embedding's (role 'input')
                self.lm_head = set_role(nn.Linear(cfg.d_model, cfg.vocab_size, bias=False), "input")
                self.lm_head.weight = self.wte.weight
                self.logit_scale = logit_scale(cfg)  # µP's readout multiplier; 1 when standard
            else:
                self.classifier = set_role(
                    nn.Linear(cfg.d_model, cfg.n_classes, bias=cfg.bias), "output"
                )
        self.init_weights()

    def init_weights(self) -> None:
        """Every initial value from the global RNG: Linear and Embedding weights by role, in
        `apply`'s order (a module's children before it), the other modules' constructor
        values (reset_parameters), then the mechanisms' post_init."""
        self.apply(self._init_weights)
        self.post_init()

    def post_init(self) -> None:
        for module in self.modules():  # mechanisms with their own initialisation
            if module is not self and hasattr(module, "post_init"):
                module.post_init()

    def _init_weights(self, module: nn.Module) -> None:
        init_module(self.cfg, module)  # by the module's role (models/parametrization.py)

    def num_params(self, non_embedding: bool = False) -> int:
        """Parameters counted once (tied weights once), the vocabulary unpadded
        (models/vocab.py); non-embedding drops wte and wpe."""
        n = sum(p.numel() for p in self.parameters())
        n -= (self.wte.num_embeddings - self.cfg.vocab_size) * self.cfg.d_model
        if non_embedding:
            n -= self.cfg.vocab_size * self.cfg.d_model + self.wpe.weight.numel()
        return n

    def embed(self, idx: Tensor) -> Tensor:
        """Token plus position embeddings of idx (B, T), after dropout: the input of block 0."""
        pos = torch.arange(idx.size(1), device=idx.device)
        return self.drop(self.wte(idx) + self.wpe(pos))

    def readout(self, h: Tensor) -> Tensor:
        """Logits over the real vocabulary from hidden states (used by the final layer and by
        early-exit routing): a padded vocabulary's extra columns are sliced off (a view); µP's
        output multiplier applied (models/parametrization.py)."""
        logits = self.lm_head(self.ln_f(h))[..., : self.cfg.vocab_size]
        return logits if self.logit_scale == 1.0 else logits * self.logit_scale

    def forward(
        self,
        idx: Tensor,
        targets: Tensor | None = None,
        *,
        progress: float = 1.0,
        pad_mask: Tensor | None = None,
    ) -> ModelOutput:
        B, T = idx.shape
        if T > self.cfg.block_size:
            raise ValueError(f"sequence length {T} exceeds block_size {self.cfg.block_size}")
        if pad_mask is not None and self.cfg.causal:
            raise ValueError("pad_mask is only supported by the classification encoder")
        ctx = ForwardContext(progress=progress, pad_mask=pad_mask)
        if self.cfg.task == "lm":
            ctx.readout = self.readout
        x = self.depth(self.embed(idx), self.blocks, ctx)
        if self.cfg.task == "lm":
            logits = self.readout(x)
            task_loss = None
            if targets is not None:  # on fp32 logits, whatever the model computes in
                task_loss = F.cross_entropy(
                    logits.flatten(0, 1).float(), targets.reshape(-1), ignore_index=-100
                )
        else:
            mask = None if pad_mask is None else pad_mask.unsqueeze(-1)
            logits = self.classifier(masked_mean(self.ln_f(x), mask, dim=1))
            task_loss = F.cross_entropy(logits.float(), targets) if targets is not None else None
        loss = None
        if task_loss is not None:
            loss = task_loss + sum(ctx.aux_losses.values(), torch.zeros((), device=idx.device))
        return ModelOutput(logits, loss, task_loss, ctx.aux_losses, ctx.metrics)
