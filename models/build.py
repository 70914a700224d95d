"""models.build(ModelConfig) -> nn.Module: the one entry point to construct a model."""

from __future__ import annotations

from contextlib import nullcontext

import torch
from torch import nn

from models.config import ModelConfig
from models.gpt import GPT
from models.vocab import pad_vocabulary


def build(cfg: ModelConfig, device: str | torch.device | None = None) -> nn.Module:
    """Build the GPT backbone with the mechanisms `cfg` switches on, its vocabulary padded
    to a multiple of 64 (models/vocab.py: same initial weights, same losses).

    `device='meta'` builds without allocating memory (exact parameter counts of the large
    presets in milliseconds).
    """
    with torch.device(device) if device is not None else nullcontext():
        model = GPT(cfg)
        pad_vocabulary(model)
    return model
