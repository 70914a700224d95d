"""AdamW parameter groups and the learning rate they get (the schedule: jobs/schedule.py)."""

from __future__ import annotations

import torch
from torch import nn

from scalelab.jobs.config import TrainConfig
from scalelab.jobs.schedule import lr_at
from scalelab.models.parametrization import lr_scale, parameter_roles

__all__ = ["adamw", "lr_at", "set_lr"]

NO_DECAY_ROLES = ("input", "vector")  # embeddings (and so the tied head), biases, norms, gains


def adamw(model: nn.Module, t: TrainConfig) -> torch.optim.Optimizer:
    """torch AdamW over parameter groups by width role (models/parametrization.py): weight
    decay on Linear weights only (not embeddings nor the tied head, biases, norms, gains:
    docs/reproducing/baseline.md; on every parameter with `weight_decay_on: all`), and each group's `lr_scale` (µP's per-layer learning
    rates; 1 under the standard parametrisation), applied by `set_lr`.
    A torch optimizer, not DeepSpeed's: its Adam kernels JIT-compile for 70-100 s.

    Fused (one kernel per step for all of a group's tensors, on CUDA and CPU): DeepSpeed
    runs this optimizer itself at every ZeRO stage here (zero_force_ds_cpu_optimizer is off,
    also with optimizer offload), on the model's parameters at stage 0 and on its own fp32
    partitions at stages 1-3, all of which the fused kernel takes."""
    groups: dict[tuple[float, float], list[nn.Parameter]] = {}
    for p, role in parameter_roles(model):
        decay = t.weight_decay if _decays(role, t) else 0.0
        groups.setdefault((decay, lr_scale(model.cfg, role)), []).append(p)
    param_groups = [
        {"params": params, "weight_decay": decay, "lr": t.lr * scale, "lr_scale": scale}
        for (decay, scale), params in sorted(groups.items(), reverse=True)
    ]
    return torch.optim.AdamW(param_groups, lr=t.lr, betas=(t.beta1, t.beta2), fused=True)


def _decays(role: str, t: TrainConfig) -> bool:
    return t.weight_decay_on == "all" or role not in NO_DECAY_ROLES


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """The schedule's learning rate times each group's `lr_scale`."""
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)
