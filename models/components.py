"""The three seams the papers change, each a registry of interchangeable components.

- output mixing (`ModelConfig.attn_out`): how attention's heads are mixed back to d_model;
- head selection (`ModelConfig.budget`): which heads run, per input;
- depth routing (`ModelConfig.tsa`): which blocks each token goes through.

Entries are 'module:Class' strings imported on first use, so the backbone never imports a
mechanism it does not run and mechanisms never edit the backbone.
"""

from __future__ import annotations

import importlib

from torch import nn

from models.config import ModelConfig

OUTPUT_MIXERS = {
    "dense": "models.dense:DenseOutputProjection",
    "hadamard": "models.hadamard:HadamardOutputProjection",
}
HEAD_SELECTION = {
    "all": "models.dense:MultiHeadAttention",
    "budget": "models.budget:BudgetAttention",
}
DEPTH_ROUTING = {
    "all": "models.dense:FullDepth",
    "tsa": "models.tsa:TokenSelectiveDepth",
}


def _load(path: str) -> type[nn.Module]:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def build_output_mixer(cfg: ModelConfig) -> nn.Module:
    return _load(OUTPUT_MIXERS[cfg.attn_out])(cfg)


def build_attention(cfg: ModelConfig, layer_idx: int) -> nn.Module:
    return _load(HEAD_SELECTION["budget" if cfg.budget else "all"])(cfg, layer_idx)


def build_depth_routing(cfg: ModelConfig) -> nn.Module:
    return _load(DEPTH_ROUTING["tsa" if cfg.tsa else "all"])(cfg)
