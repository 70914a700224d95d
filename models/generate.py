"""Sampling from an LM with the KV cache of models/decode.py: greedy, temperature, top-k."""

from __future__ import annotations

import torch
from pydantic import Field
from torch import Tensor, nn

from scalelab.contract.config import FrozenConfig
from scalelab.models.decode import KVCache, forward_cached


class SamplingConfig(FrozenConfig):
    max_new_tokens: int = Field(64, ge=1, description="tokens to generate after the prompt")
    temperature: float = Field(
        1.0, ge=0.0, description="softmax temperature; 0 takes the most likely token (greedy)"
    )
    top_k: int | None = Field(None, ge=1, description="sample among the k most likely only")
    seed: int = Field(0, ge=0, description="seed of the sampling generator (reproducible)")


def next_tokens(logits: Tensor, cfg: SamplingConfig, generator: torch.Generator) -> Tensor:
    """(B, V) logits -> (B,) token ids."""
    if cfg.temperature == 0.0:
        return logits.argmax(dim=-1)
    logits = logits.float() / cfg.temperature
    if cfg.top_k is not None and cfg.top_k < logits.size(-1):
        kth = logits.topk(cfg.top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(1)


@torch.no_grad()
def generate(model: nn.Module, prompt: Tensor, cfg: SamplingConfig) -> Tensor:
    """The prompt (B, T0) followed by `cfg.max_new_tokens` sampled tokens: (B, T0 + n).
    One prefill over the prompt, then one cached decode step per token."""
    B, T0 = prompt.shape
    cache = KVCache.allocate(model, B, T0 + cfg.max_new_tokens - 1)
    generator = torch.Generator(device=prompt.device).manual_seed(cfg.seed)
    logits = forward_cached(model, prompt, cache, logits="last")
    out = [prompt]
    for i in range(cfg.max_new_tokens):
        token = next_tokens(logits, cfg, generator)
        out.append(token[:, None])
        if i + 1 < cfg.max_new_tokens:
            logits = forward_cached(model, token[:, None], cache, logits="last")
    return torch.cat(out, dim=1)
