"""What autograd keeps for backward of one training forward: every tensor the pass saves,
seen through `torch.autograd.graph.saved_tensors_hooks`, counted once per storage,
parameters left out (the planner's activation terms are held against it)."""

from __future__ import annotations

import torch

from scalelab.jobs.training.train import _checkpointed
from scalelab.models.build import build
from scalelab.models.config import ModelConfig


def saved_bytes(
    cfg: ModelConfig, batch: int, checkpointing: bool, dtype: torch.dtype = torch.float32
) -> int:
    """Bytes autograd keeps for one forward of `batch` sequences of cfg.block_size tokens."""
    torch.manual_seed(0)
    model = build(cfg).to(dtype).train()
    if checkpointing:  # as jobs/training/train.py wraps the blocks
        for block in model.blocks:
            block.mlp_update = _checkpointed(block.mlp_update)
            block.attn_update = _checkpointed(block.attn_update)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    idx = torch.randint(0, cfg.vocab_size, (batch, cfg.block_size))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(idx, idx)
    return sum(saved.values())
