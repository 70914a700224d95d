"""Validation on the fixed validation set, averaged over all ranks' examples: val/loss, and
val/accuracy for the classification encoder."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from jobs.data import Batch
from jobs.distributed import DistEnv


def model_inputs(b: Batch, device: str) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
    """(x, y, keyword arguments) of a batch on `device`; pad_mask only when the batch has one."""
    x = torch.from_numpy(b.x).to(device)
    y = torch.from_numpy(b.y).to(device)
    kw = {} if b.pad_mask is None else {"pad_mask": torch.from_numpy(b.pad_mask).to(device)}
    return x, y, kw


@torch.no_grad()
def evaluate(engine: Any, batches: list[Batch], env: DistEnv, progress: float) -> dict[str, float]:
    """{'val/loss': mean task loss over every target} (+ 'val/accuracy' when classifying)."""
    engine.eval()
    # (sum of losses x targets, targets, correct class predictions, classified examples)
    total = torch.zeros(4, dtype=torch.float64)
    for b in batches:
        x, y, kw = model_inputs(b, env.device)
        out = engine(x, y, progress=progress, **kw)
        n = int((y != -100).sum())
        total[:2] += torch.tensor([float(out.task_loss) * n, n], dtype=torch.float64)
        if y.dim() == 1:  # class labels: the logits are (B, n_classes)
            total[2] += float((out.logits.argmax(-1) == y).sum())
            total[3] += len(y)
    if env.world_size > 1:
        total = total.to(env.device)
        dist.all_reduce(total)
        total = total.cpu()
    engine.train()
    metrics = {"val/loss": float(total[0] / total[1].clamp_min(1))}
    if total[3] > 0:
        metrics["val/accuracy"] = float(total[2] / total[3])
    return metrics
