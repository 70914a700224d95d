"""A trial's training budget in tokens and optimizer steps, from whichever budget it gives
(tokens, tokens per parameter, FLOPs): one rule for the plan, the checks and the job;
torch-free."""

from __future__ import annotations

import math

from scalelab.jobs.config import JobConfig
from scalelab.models.flops import count_params, train_flops_per_token


def total_tokens(job: JobConfig, n_params: int | None = None) -> int:
    """The training budget in tokens: given, or tokens_per_param x N, or FLOPs / (FLOPs per
    token) with N and FLOPs per token from models/flops.py at the data's sequence length
    (`n_params`: N when the caller has counted it)."""
    t = job.train
    if t.tokens is not None:
        return t.tokens
    if t.tokens_per_param is not None:
        return int(t.tokens_per_param * (n_params or count_params(job.model)))
    return int(t.flops / train_flops_per_token(job.model, job.data.seq_len))


def total_steps(job: JobConfig) -> int:
    return max(1, math.ceil(total_tokens(job) / job.train.global_batch_tokens))
