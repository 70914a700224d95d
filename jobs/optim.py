"""Token budget, learning-rate schedule and AdamW parameter groups."""

from __future__ import annotations

import math

import torch
from torch import nn

from jobs.config import JobConfig, TrainConfig
from models.flops import count_params, train_flops_per_token


def total_tokens(job: JobConfig) -> int:
    """The training budget in tokens: given, or tokens_per_param x N, or FLOPs / (FLOPs per
    token) with N and FLOPs per token from models/flops.py at the data's sequence length."""
    t = job.train
    if t.tokens is not None:
        return t.tokens
    if t.tokens_per_param is not None:
        return int(t.tokens_per_param * count_params(job.model))
    return int(t.flops / train_flops_per_token(job.model, job.data.seq_len))


def total_steps(job: JobConfig) -> int:
    return max(1, math.ceil(total_tokens(job) / job.train.global_batch_tokens))


def lr_at(step: int, steps: int, t: TrainConfig) -> float:
    """Linear warmup to t.lr, then cosine / linear decay to min_lr_ratio x lr (or constant)."""
    warmup = int(t.warmup_fraction * steps)
    if step < warmup:
        return t.lr * (step + 1) / warmup
    if t.schedule == "constant":
        return t.lr
    frac = (step - warmup) / max(1, steps - warmup)
    decay = 0.5 * (1 + math.cos(math.pi * frac)) if t.schedule == "cosine" else 1 - frac
    return t.lr * (t.min_lr_ratio + (1 - t.min_lr_ratio) * decay)


def adamw(model: nn.Module, t: TrainConfig) -> torch.optim.Optimizer:
    """torch AdamW with weight decay only on matrices (not biases, norms or gains).
    A torch optimizer, not DeepSpeed's: its Adam kernels JIT-compile for 70-100 s."""
    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            (decay if p.dim() >= 2 else no_decay).append(p)
    groups = [
        {"params": decay, "weight_decay": t.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=t.lr, betas=(t.beta1, t.beta2), foreach=False)
