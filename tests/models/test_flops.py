import math

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from scalelab.models import catalog
from scalelab.models.build import build
from scalelab.models.config import ModelConfig
from scalelab.models.flops import (
    forward_flops_per_token,
    train_flops_per_token,
    train_flops_per_token_causal,
)


def measured_flops(cfg: ModelConfig, B: int, T: int, backward: bool = False) -> int:
    model = build(cfg).train(backward)
    idx = torch.randint(0, cfg.vocab_size, (B, T))
    counter = FlopCounterMode(display=False)
    # The CPU flash kernel is not registered with the counter; the math path (two bmm
    # over the full T x T scores) is, and costs the same FLOPs.
    with counter, sdpa_kernel([SDPBackend.MATH]):
        out = model(idx, idx if backward else None)
        if backward:
            out.loss.backward()
    return counter.get_total_flops()


@pytest.mark.parametrize("variant", ["dense", "hadamard"])
@pytest.mark.parametrize("size", ["nano", "micro"])
def test_forward_matmul_flops_match_flop_counter(size, variant):
    cfg = ModelConfig(size=size, vocab_size=512, block_size=64, **catalog.variant_fields(variant))
    B, T = 2, 64
    analytic = forward_flops_per_token(cfg, seq_len=T).matmul * B * T
    with torch.no_grad():
        measured = measured_flops(cfg, B, T)
    assert analytic == pytest.approx(measured, rel=0.02)


def test_training_flops_are_three_forwards_for_the_dense_model():
    cfg = ModelConfig(size="nano", vocab_size=512, block_size=64)
    B, T = 2, 64
    measured = measured_flops(cfg, B, T, backward=True)
    assert train_flops_per_token(cfg, seq_len=T) * B * T == pytest.approx(measured, rel=0.02)


def test_hadamard_mixing_is_cheaper_than_dense():
    dense = forward_flops_per_token(ModelConfig(size="1.3B"))
    had = forward_flops_per_token(ModelConfig(size="1.3B", hadamard={}))
    assert 0 < had.output_mixing < dense.output_mixing / 20  # 2 d (32 + 64) versus 2 d^2
    assert had.mlp == dense.mlp and had.attention_qkv == dense.attention_qkv


# --- Token-Selective Attention ------------------------------------------------------------
# The counts are exact, so a tight tolerance makes the routers' ~1% of FLOPs matter.


def test_tsa_soft_training_executes_every_block_and_the_routers():
    cfg = ModelConfig(size="micro", vocab_size=512, block_size=64, tsa={})
    B, T = 2, 64
    with torch.no_grad():
        forward = measured_flops_in_mode(cfg, B, T, train=True)
    assert forward_flops_per_token(cfg, seq_len=T).matmul * B * T == pytest.approx(
        forward, rel=1e-3
    )
    dense = forward_flops_per_token(ModelConfig(size="micro", vocab_size=512, block_size=64))
    assert forward_flops_per_token(cfg, seq_len=T).mlp == dense.mlp  # nothing skipped
    measured = measured_flops(cfg, B, T, backward=True)
    assert train_flops_per_token(cfg, seq_len=T) * B * T == pytest.approx(measured, rel=1e-3)


def test_tsa_sparse_inference_flops_follow_the_executed_ffn_fraction():
    from scalelab.models.flops import ActiveFractions

    cfg = ModelConfig(size="micro", vocab_size=512, block_size=64, tsa={})
    B, T = 2, 64
    torch.manual_seed(0)
    model = build(cfg).eval()
    for router in model.depth.routers:  # centre p on 0.5 so about half the tokens halt
        torch.nn.init.zeros_(router.out.bias)
        torch.nn.init.normal_(router.out.weight, std=3.0)
    model.depth.force_path = "sparse"
    idx = torch.randint(0, cfg.vocab_size, (B, T))
    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter, sdpa_kernel([SDPBackend.MATH]):
        out = model(idx)
    ffn_tokens = out.metrics["tsa/alpha"].item()
    assert 0.1 < ffn_tokens < 0.9  # a real mix of halted and active tokens
    analytic = forward_flops_per_token(cfg, T, ActiveFractions(ffn_tokens=ffn_tokens))
    assert analytic.matmul * B * T == pytest.approx(counter.get_total_flops(), rel=1e-3)
    assert analytic.mlp < forward_flops_per_token(cfg, T).mlp


def measured_flops_in_mode(cfg: ModelConfig, B: int, T: int, train: bool) -> int:
    torch.manual_seed(0)
    model = build(cfg).train(train)
    idx = torch.randint(0, cfg.vocab_size, (B, T))
    counter = FlopCounterMode(display=False)
    with counter, sdpa_kernel([SDPBackend.MATH]):
        model(idx)
    return counter.get_total_flops()


@pytest.mark.parametrize("task", ["classify", "lm"])
@pytest.mark.parametrize("k", [1, 3])
def test_budget_inference_flops_match_flop_counter_at_a_known_k(task, k):
    from scalelab.models.budget_flops import budget_inference_flops
    from scalelab.models.budget_layers import budget_decisions
    from scalelab.models.flops import ActiveFractions

    extra = {"task": "classify", "n_classes": 3} if task == "classify" else {}
    cfg = ModelConfig(size="micro", vocab_size=512, block_size=64, budget={}, **extra)
    model = build(cfg).eval()
    H, B, T = cfg.n_head, 2, 64
    for block in model.blocks:  # s = (k + 0.5) / H for every input, a fixed head ranking
        torch.nn.init.zeros_(block.attn.budget_net[2].weight)
        torch.nn.init.constant_(block.attn.budget_net[2].bias, math.log((k + 0.5) / (H - k - 0.5)))
        torch.nn.init.zeros_(block.attn.relevance_net.weight)
        block.attn.relevance_net.bias.data = torch.randperm(H).float()
    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter, sdpa_kernel([SDPBackend.MATH]):
        model(torch.randint(0, cfg.vocab_size, (B, T)))
    measured = counter.get_total_flops()
    fwd = forward_flops_per_token(cfg, seq_len=T, active=ActiveFractions(heads=k / H))
    assert fwd.matmul * B * T == pytest.approx(measured, rel=0.02)
    decisions = budget_decisions(model)
    assert all((d[0] == k).all() for d in decisions)
    attention = budget_inference_flops(cfg, [d[0] for d in decisions], T, [d[1] for d in decisions])
    parts = fwd.attention_qkv + fwd.attention_context + fwd.output_mixing + fwd.mechanisms
    assert attention == pytest.approx(parts * B * T, rel=1e-9)


@pytest.mark.parametrize("variant", ["dense", "hadamard"])
def test_causal_count_takes_the_attention_triangle_and_nothing_else(variant):
    """Issue 26, item 6d: MFU counted every query against all T keys. Query t attends to
    t + 1 of them; summed here token by token, apart from models/flops.py's formula."""
    T = 48
    cfg = ModelConfig(size="nano", vocab_size=256, block_size=64, attn_out=variant)
    d, L = cfg.d_model, cfg.n_layer
    full, causal = train_flops_per_token(cfg, T), train_flops_per_token_causal(cfg, T)
    per_query = [4 * d * (t + 1) for t in range(T)]  # scores + weighted sum over t + 1 keys
    saved = 3 * L * (4 * d * T - sum(per_query) / T)  # x3: forward + backward
    assert full - causal == pytest.approx(saved, rel=1e-12)
    assert full == 3 * forward_flops_per_token(cfg, T).total  # the budget's count unchanged
    encoder = ModelConfig(size="nano", vocab_size=256, block_size=64, task="classify", n_classes=2)
    assert train_flops_per_token_causal(encoder, T) == train_flops_per_token(encoder, T)


def test_mfu_is_logged_in_both_conventions_and_named_by_them():
    from scalelab.jobs.training.accounting import mfu_metrics

    cfg = ModelConfig(size="nano", vocab_size=256, block_size=64)
    full, causal = train_flops_per_token(cfg, 64), train_flops_per_token_causal(cfg, 64)
    m = mfu_metrics(1e6, full, causal, world_size=2, peak=1e12)
    assert m["perf/mfu"] == pytest.approx(1e6 * full / 2e12)
    assert m["perf/mfu_causal"] == pytest.approx(1e6 * causal / 2e12)
    assert m["perf/mfu_causal"] < m["perf/mfu"]
    assert mfu_metrics(1e6, full, causal, world_size=2, peak=None) == {}  # a CPU: none
