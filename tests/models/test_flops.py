import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from models.build import build
from models.config import ModelConfig
from models.flops import forward_flops_per_token, train_flops_per_token
from models.variants import variant_fields


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
    cfg = ModelConfig(size=size, vocab_size=512, block_size=64, **variant_fields(variant))
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
    had = forward_flops_per_token(ModelConfig(size="1.3B", attn_out="hadamard"))
    assert had.attention_out == 0 and had.hadamard_mixing > 0
    assert had.hadamard_mixing < dense.attention_out / 100  # d log d versus 2 d^2
    assert had.mlp == dense.mlp and had.attention_qkv == dense.attention_qkv
