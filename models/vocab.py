"""The vocabulary padded to a multiple of 64 at build time, so the embedding and LM-head
matrices have tensor-core friendly shapes (50257 -> 50304 for GPT-2's BPE).

The padding is added after the model is built and initialised, as zero rows: the random
draws, and so every initial weight, are those of the unpadded model. A padded row is never
an input (token ids are < vocab_size) and never predicted (GPT.readout slices the logits to
the real vocabulary before anything reads them), so its gradient is exactly zero and it stays
zero under AdamW with weight decay. Losses, parameter counts (GPT.num_params,
models/flops.py) and FLOPs are those of the unpadded vocabulary; the memory planner
(orchestrator/plan/memory.py) counts the padded rows, which do take memory.
"""

from __future__ import annotations

from typing import Any

VOCAB_MULTIPLE = 64


def padded_vocab_size(vocab_size: int) -> int:
    return -(-vocab_size // VOCAB_MULTIPLE) * VOCAB_MULTIPLE


def pad_vocabulary(model: Any) -> None:
    """Append zero rows to `model.wte` (and the LM head tied to it) up to the padded size."""
    import torch  # here: the planner imports this module torch-free
    from torch import nn

    real = model.cfg.vocab_size
    padded = padded_vocab_size(real)
    weight = model.wte.weight
    if weight.shape[0] != real or padded == real:
        return
    rows = torch.zeros(padded - real, weight.shape[1], dtype=weight.dtype, device=weight.device)
    model.wte.weight = nn.Parameter(torch.cat([weight.detach(), rows]))
    model.wte.num_embeddings = padded
    if hasattr(model, "lm_head"):
        model.lm_head.weight = model.wte.weight  # tied input/output embeddings
        model.lm_head.out_features = padded
