"""Cached decoding (models/decode.py) computes the full forward's function, token by token,
for every variant; sampling is seeded and honours greedy / top-k."""

import pytest
import torch
from varied_models import varied_model

from scalelab.models import catalog
from scalelab.models.decode import KVCache, forward_cached
from scalelab.models.generate import SamplingConfig, generate

VOCAB, T, PREFILL = 64, 20, 7


def decisions_vary(model: torch.nn.Module, idx: torch.Tensor) -> None:
    """The mechanisms made mixed decisions on `idx` (else the test would prove little)."""
    cfg = model.cfg
    out = model(idx)
    if cfg.tsa is not None:
        assert 0.2 < float(out.metrics["tsa/alpha"]) < 0.8
    if cfg.budget is not None:
        k = torch.cat([layer_k.flatten() for layer_k, _ in _budget_k(model)])
        assert k.unique().numel() >= 2


def _budget_k(model):
    from scalelab.models.budget_layers import budget_decisions

    return budget_decisions(model)


@pytest.mark.parametrize("variant", catalog.variants())
def test_cached_decode_equals_the_full_forward_token_by_token(variant):
    model = varied_model(variant)
    idx = torch.randint(0, VOCAB, (2, T), generator=torch.Generator().manual_seed(1))
    decisions_vary(model, idx)
    with torch.no_grad():
        full = model(idx).logits  # (2, T, V); causal: position t sees only idx[:, :t+1]
    cache = KVCache.allocate(model, batch=2, capacity=T)
    steps = [forward_cached(model, idx[:, :PREFILL], cache)]
    steps += [forward_cached(model, idx[:, t : t + 1], cache) for t in range(PREFILL, T)]
    cached = torch.cat(steps, dim=1)
    assert cache.length == T
    torch.testing.assert_close(cached, full, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("variant", ["budget+tsa", "hadamard+tsa"])
def test_one_sequence_decodes_alone_as_in_the_batch(variant):
    """Batch 1 takes the paths where a halted token or a head set is the whole batch's."""
    assert_cached_decode_equals_the_full_forward(varied_model(variant, seed=3), batch=1, seed=2)


def test_soft_tsa_gates_decode_like_the_full_forward():
    model = varied_model("tsa", tsa={"sparse_inference": False})
    assert_cached_decode_equals_the_full_forward(model, batch=2, seed=1)


def assert_cached_decode_equals_the_full_forward(model, batch: int, seed: int) -> None:
    idx = torch.randint(0, VOCAB, (batch, T), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        full = model(idx).logits
    cache = KVCache.allocate(model, batch=batch, capacity=T)
    cached = torch.cat([forward_cached(model, idx[:, t : t + 1], cache) for t in range(T)], 1)
    torch.testing.assert_close(cached, full, rtol=1e-4, atol=1e-4)


def test_the_cache_refuses_what_does_not_fit():
    model = varied_model("dense")
    with pytest.raises(ValueError, match="exceed the model's block_size 32"):
        KVCache.allocate(model, batch=1, capacity=33)
    cache = KVCache.allocate(model, batch=1, capacity=4)
    forward_cached(model, torch.zeros(1, 3, dtype=torch.long), cache)
    with pytest.raises(ValueError, match=r"positions \[3, 5\) do not fit"):
        forward_cached(model, torch.zeros(1, 2, dtype=torch.long), cache)
    with pytest.raises(ValueError, match="model.eval"):
        forward_cached(model.train(), torch.zeros(1, 1, dtype=torch.long), cache)


def test_greedy_generation_follows_the_full_forward_argmax():
    model = varied_model("hadamard+budget+tsa")
    prompt = torch.randint(0, VOCAB, (3, 5), generator=torch.Generator().manual_seed(4))
    out = generate(model, prompt, SamplingConfig(max_new_tokens=6, temperature=0.0))
    assert out.shape == (3, 11) and torch.equal(out[:, :5], prompt)
    with torch.no_grad():
        argmax = model(out).logits[:, 4:-1].argmax(-1)  # the prediction at each step
    assert torch.equal(out[:, 5:], argmax)


def test_sampling_is_seeded_and_top_k_restricts_the_choice():
    model = varied_model("dense")
    prompt = torch.zeros(8, 1, dtype=torch.long)
    one = SamplingConfig(max_new_tokens=1, temperature=1.0, top_k=2, seed=5)
    first = generate(model, prompt, one)
    assert torch.equal(first, generate(model, prompt, one))  # same seed, same tokens
    with torch.no_grad():
        top2 = model(prompt).logits[:, -1].topk(2).indices
    assert all(int(t) in top2[i].tolist() for i, t in enumerate(first[:, 1]))
    many = SamplingConfig(max_new_tokens=12, temperature=2.0, seed=5)
    other = SamplingConfig(max_new_tokens=12, temperature=2.0, seed=6)
    assert not torch.equal(generate(model, prompt, many), generate(model, prompt, other))
