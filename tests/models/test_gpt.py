import math

import pytest
import torch

from scalelab.models import catalog
from scalelab.models.build import build
from scalelab.models.config import ModelConfig
from scalelab.models.context import ForwardContext

VOCAB, T = 64, 24


def tiny(variant: str = "dense", **kw) -> ModelConfig:
    return ModelConfig(
        size="nano", vocab_size=VOCAB, block_size=32, **catalog.variant_fields(variant), **kw
    )


@pytest.mark.parametrize("mode", ["train", "eval"])
@pytest.mark.parametrize("variant", catalog.variants())
def test_changing_a_future_token_never_changes_past_logits(variant, mode):
    torch.manual_seed(0)
    model = build(tiny(variant)).train(mode == "train")
    idx = torch.randint(0, VOCAB, (3, T))
    t = 10
    changed = idx.clone()
    changed[:, t + 1 :] = (changed[:, t + 1 :] + 7) % VOCAB
    with torch.no_grad():
        a = model(idx).logits
        b = model(changed).logits
    assert torch.allclose(a[:, : t + 1], b[:, : t + 1], atol=1e-5)
    assert not torch.allclose(a[:, t + 1 :], b[:, t + 1 :], atol=1e-3)  # the change is seen


def test_encoder_is_bidirectional_and_pools_for_classification():
    torch.manual_seed(0)
    model = build(tiny(task="classify", n_classes=3)).eval()
    idx = torch.randint(0, VOCAB, (2, T))
    changed = idx.clone()
    changed[:, -1] = (changed[:, -1] + 1) % VOCAB
    with torch.no_grad():
        x = model.wte(idx) + model.wpe(torch.arange(T))
        y = model.wte(changed) + model.wpe(torch.arange(T))
        hx = model.depth(x, model.blocks, ForwardContext())
        hy = model.depth(y, model.blocks, ForwardContext())
    assert not torch.allclose(hx[:, 0], hy[:, 0], atol=1e-4)  # position 0 sees the last token
    out = model(idx, targets=torch.tensor([0, 2]))
    assert out.logits.shape == (2, 3) and out.loss.ndim == 0


def test_padding_is_ignored_by_the_encoder():
    torch.manual_seed(0)
    model = build(tiny(task="classify", n_classes=3)).eval()
    idx = torch.randint(0, VOCAB, (1, T))
    mask = torch.ones(1, T, dtype=torch.bool)
    mask[:, 16:] = False
    other = idx.clone()
    other[:, 16:] = (other[:, 16:] + 5) % VOCAB
    with torch.no_grad():
        a = model(idx, pad_mask=mask).logits
        b = model(other, pad_mask=mask).logits
        short = model(idx[:, :16]).logits
    assert torch.allclose(a, b, atol=1e-5) and torch.allclose(a, short, atol=1e-5)


def test_embeddings_are_tied():
    """(The init rule of every weight: tests/models/test_parametrization.py.)"""
    model = build(ModelConfig(size="micro", vocab_size=VOCAB, block_size=32))
    assert model.lm_head.weight is model.wte.weight
    assert model.wte.weight.std().item() == pytest.approx(0.02, rel=0.05)


def test_sequence_longer_than_context_is_refused():
    model = build(tiny())
    with pytest.raises(ValueError, match="exceeds block_size 32"):
        model(torch.zeros(1, 33, dtype=torch.long))


def test_a_tiny_model_learns_a_repeating_sequence():
    torch.manual_seed(0)
    model = build(tiny())
    data = torch.arange(T + 1).repeat(8, 1) % 13
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(60):
        out = model(data[:, :-1], data[:, 1:])
        opt.zero_grad()
        out.loss.backward()
        opt.step()
        losses.append(out.loss.item())
    assert losses[0] > math.log(VOCAB) - 0.5  # starts near uniform
    assert losses[-1] < 0.25 * losses[0]
