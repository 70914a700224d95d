"""The learning-rate schedule of a trial, torch-free (the job, the checks and the branching
planner share it; docs/sweep-yaml.md, 'Learning-rate schedules').

Every schedule warms up linearly over `warmup_steps` (train.warmup_steps, else
warmup_fraction x steps). cosine / linear then decay to min_lr_ratio x lr over the rest
of the run; constant stays at lr. wsd (warmup-stable-decay, Hägele et al. 2024) stays at
lr until `cooldown_start` and then decays to min_lr_ratio x lr over the last
cooldown_fraction of the steps, in the `cooldown_shape` linear (1 - x) or 1-sqrt
(1 - sqrt(x)), x running from 1/cooldown to 1 so the last step trains at the minimum.
Before its cooldown a wsd trial's learning rate does not depend on its length: trials
that differ only in their budget share that prefix (orchestrator/plan/branching.py).
"""

from __future__ import annotations

import math

from scalelab.jobs.config import JobCheckError, TrainConfig


def warmup_steps(steps: int, t: TrainConfig) -> int:
    return t.warmup_steps if t.warmup_steps is not None else int(t.warmup_fraction * steps)


def cooldown_steps(steps: int, t: TrainConfig) -> int:
    """Steps of a wsd trial's decay: cooldown_fraction x steps, rounded, at least one."""
    return min(steps, max(1, round(t.cooldown_fraction * steps)))


def cooldown_start(steps: int, t: TrainConfig) -> int:
    """The first step of a wsd trial's decay (`steps` for the other schedules: their decay,
    if any, starts right after the warmup and depends on the length)."""
    return steps - cooldown_steps(steps, t) if t.schedule == "wsd" else steps


def check_schedule(steps: int, t: TrainConfig) -> None:
    """A wsd trial's warmup ends before its cooldown starts."""
    if t.schedule != "wsd":
        return
    warm, start = warmup_steps(steps, t), cooldown_start(steps, t)
    if warm > start:
        key = "train.warmup_steps" if t.warmup_steps is not None else "train.warmup_fraction"
        raise JobCheckError(
            (key, "train.cooldown_fraction"),
            f"train.schedule='wsd': the warmup ({warm} steps) runs into the cooldown, which "
            f"starts at step {start} of {steps} (train.cooldown_fraction="
            f"{t.cooldown_fraction}); shorten the warmup or the cooldown, or raise the budget",
        )


def lr_at(step: int, steps: int, t: TrainConfig) -> float:
    """The learning rate of 0-based optimizer step `step` of a run of `steps` steps."""
    warmup = warmup_steps(steps, t)
    if step < warmup:
        return t.lr * (step + 1) / warmup
    if t.schedule == "constant":
        return t.lr
    low = t.min_lr_ratio * t.lr
    if t.schedule == "wsd":
        start = cooldown_start(steps, t)
        if step < start:
            return t.lr
        x = min(1.0, (step - start + 1) / cooldown_steps(steps, t))
        decay = 1 - math.sqrt(x) if t.cooldown_shape == "1-sqrt" else 1 - x
        return low + (t.lr - low) * decay
    frac = (step - warmup) / max(1, steps - warmup)
    decay = 0.5 * (1 + math.cos(math.pi * frac)) if t.schedule == "cosine" else 1 - frac
    return t.lr * (t.min_lr_ratio + (1 - t.min_lr_ratio) * decay)
