"""masked_mean is the one pooling of the backbone, BudgetFormer and TSA: bit for bit the
three formulas it replaced."""

import torch

from scalelab.models.context import masked_mean


def test_masked_mean_matches_three_old_spellings():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 5, 8, generator=g)
    pad = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]], dtype=torch.bool)
    w = pad.to(x.dtype).unsqueeze(-1)
    # classifier pooling (models/gpt.py): (B, T, d) -> (B, d)
    assert torch.equal(masked_mean(x, pad.unsqueeze(-1), dim=1), (x * w).sum(1) / w.sum(1))
    assert torch.equal(masked_mean(x, None, dim=1), x.mean(dim=1))
    # BudgetFormer's encoder decision input: keepdim
    pooled = masked_mean(x, pad.unsqueeze(-1), dim=1, keepdim=True)
    assert torch.equal(pooled, (x * w).sum(1, keepdim=True) / w.sum(1, keepdim=True))
    # TSA's alpha: gates (L-1, B, T), the pad mask broadcast over the layers, one number
    gates = torch.rand(2, 3, 5, generator=g)
    weights = pad.to(gates.dtype).expand_as(gates)
    assert torch.equal(masked_mean(gates, pad), (gates * weights).sum() / weights.sum())
    assert torch.equal(masked_mean(gates, None), gates.mean())


def test_an_all_padded_row_gives_zero_not_nan():
    x = torch.ones(1, 4, 2)
    assert torch.equal(
        masked_mean(x, torch.zeros(1, 4, 1, dtype=torch.bool), dim=1), torch.zeros(1, 2)
    )
