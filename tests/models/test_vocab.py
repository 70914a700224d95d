"""The vocabulary padded to a multiple of 64 at build time (models/vocab.py): the same
initial weights and losses as the unpadded model, padded logits never predicted, padded rows
never trained, parameter counts of the real vocabulary; and the loss on fp32 logits."""

import pytest
import torch
import torch.nn.functional as F

from scalelab.models.build import build
from scalelab.models.config import ModelConfig
from scalelab.models.flops import count_params
from scalelab.models.gpt import GPT
from scalelab.models.vocab import padded_vocab_size

VOCAB = 250  # padded to 256


def _pair(**kw) -> tuple[torch.nn.Module, torch.nn.Module]:
    cfg = ModelConfig(size="nano", vocab_size=VOCAB, block_size=32, **kw)
    torch.manual_seed(0)
    padded = build(cfg)
    torch.manual_seed(0)
    plain = GPT(cfg)  # the model as constructed, before build() pads it
    return padded, plain


def test_padding_sizes():
    assert [padded_vocab_size(v) for v in (50257, 256, 250, 1)] == [50304, 256, 256, 64]


def test_padded_model_has_the_unpadded_weights_and_loss():
    padded, plain = _pair()
    assert padded.wte.weight.shape == (256, 64) and padded.lm_head.weight is padded.wte.weight
    assert torch.equal(padded.wte.weight[:VOCAB], plain.wte.weight)
    assert not padded.wte.weight[VOCAB:].any()
    for (name, a), (_, b) in zip(
        padded.named_parameters(), plain.named_parameters(), strict=True
    ):  # every later tensor: the same random draws
        if name != "wte.weight":
            assert torch.equal(a, b), name
    idx = torch.randint(0, VOCAB, (4, 32))
    out_p, out_u = padded(idx, idx), plain(idx, idx)
    assert out_p.logits.shape == (4, 32, VOCAB)  # never a padded column
    assert out_p.loss.item() == out_u.loss.item()
    out_p.loss.backward()
    out_u.loss.backward()
    assert not padded.wte.weight.grad[VOCAB:].any()  # padded rows never move
    assert torch.allclose(padded.wte.weight.grad[:VOCAB], plain.wte.weight.grad, atol=1e-7)


@pytest.mark.parametrize("kw", [{}, {"task": "classify", "n_classes": 3}])
def test_parameter_counts_keep_the_real_vocabulary(kw):
    padded, plain = _pair(**kw)
    for non_embedding in (False, True):
        assert padded.num_params(non_embedding) == plain.num_params(non_embedding)
        assert padded.num_params(non_embedding) == count_params(padded.cfg, non_embedding)


def test_a_bf16_model_takes_its_loss_on_fp32_logits():
    padded, _ = _pair()
    model = padded.to(torch.bfloat16)
    idx = torch.randint(0, VOCAB, (4, 32))
    out = model(idx, idx)
    assert out.logits.dtype == torch.bfloat16 and out.task_loss.dtype == torch.float32
    expected = F.cross_entropy(out.logits.float().flatten(0, 1), idx.flatten())
    assert out.task_loss.item() == expected.item()
    assert out.task_loss.item() != out.task_loss.bfloat16().item()  # not bf16-rounded
