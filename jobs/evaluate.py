"""Validation loss on the fixed validation set, averaged over all ranks' examples."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from jobs.data import Batch
from jobs.distributed import DistEnv


@torch.no_grad()
def evaluate(engine: Any, batches: list[Batch], env: DistEnv, progress: float) -> float:
    """Mean task loss over every target of the validation set (all ranks together)."""
    engine.eval()
    total = torch.zeros(2, dtype=torch.float64)  # (sum of losses x targets, targets)
    for b in batches:
        x = torch.from_numpy(b.x).to(env.device)
        y = torch.from_numpy(b.y).to(env.device)
        out = engine(x, y, progress=progress)
        n = int((y != -100).sum())
        total += torch.tensor([float(out.task_loss) * n, n], dtype=torch.float64)
    if env.world_size > 1:
        dist.all_reduce(total)
    engine.train()
    return float(total[0] / total[1].clamp_min(1))
