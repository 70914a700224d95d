"""A nano model whose mechanisms decide differently per token, for the tests that check a
cached or batched path against the full forward (tests/models/test_decode.py,
tests/jobs/downstream/test_adapter.py): random init leaves BudgetFormer's k and TSA's
routing nearly uniform, which would hide a path that mixes tokens up."""

import torch

from scalelab.models import catalog
from scalelab.models.build import build
from scalelab.models.config import ModelConfig


def varied_model(variant: str, seed: int = 0, vocab: int = 64, **fields) -> torch.nn.Module:
    """A nano model whose mechanisms make different per-token decisions: BudgetFormer's k
    and head sets vary with the prefix, TSA halts about half the tokens at each router."""
    torch.manual_seed(seed)
    fields = {**catalog.variant_fields(variant), **fields}
    cfg = ModelConfig(size="nano", vocab_size=vocab, block_size=32, **fields)
    model = build(cfg).eval()
    g = torch.Generator().manual_seed(seed)
    for block in model.blocks:
        if cfg.budget is not None:
            block.attn.budget_net[2].weight.data.normal_(0.0, 3.0, generator=g)
            block.attn.relevance_net.weight.data.normal_(0.0, 1.0, generator=g)
        if cfg.attn_out == "hadamard":
            block.attn.out_proj.alpha.data.mul_(1.0 + 0.5 * torch.randn(cfg.d_model, generator=g))
            block.attn.out_proj.beta.data.normal_(0.0, 0.02, generator=g)
    if cfg.tsa is not None:
        for router in model.depth.routers:
            torch.nn.init.zeros_(router.out.bias)
            router.out.weight.data.normal_(0.0, 3.0, generator=g)
    return model
