import torch

from scalelab.kernels.reference import dense_hadamard_transform
from scalelab.models.build import build
from scalelab.models.config import ModelConfig
from scalelab.models.flops import count_params
from scalelab.models.sizes import SIZES


def test_each_block_saves_exactly_d_squared_minus_d_parameters():
    for name in SIZES:
        dense = ModelConfig(size=name)
        had = ModelConfig(size=name, attn_out="hadamard")
        d, L = dense.d_model, dense.n_layer
        assert count_params(dense) - count_params(had) == L * ((d * d + d) - 2 * d)
    nano = build(ModelConfig(size="nano", attn_out="hadamard"), device="meta")
    mixer = nano.blocks[0].attn.out_proj
    assert sum(p.numel() for p in mixer.parameters()) == 2 * 64


def test_projection_is_the_scaled_transform_plus_affine():
    torch.manual_seed(0)
    model = build(ModelConfig(size="nano", vocab_size=64, block_size=16, attn_out="hadamard"))
    mixer = model.blocks[0].attn.out_proj
    with torch.no_grad():
        mixer.alpha.uniform_(0.5, 1.5)
        mixer.beta.normal_()
    y = torch.randn(3, 5, 64)
    expected = mixer.alpha * dense_hadamard_transform(y) + mixer.beta
    assert torch.allclose(mixer(y), expected, atol=1e-5)


def test_attention_output_keeps_the_dense_variance_at_init():
    torch.manual_seed(0)
    x = torch.randn(4, 64, 256)
    stds = {}
    for variant in ("dense", "hadamard"):
        cfg = ModelConfig(size="mini", vocab_size=64, block_size=64, attn_out=variant)
        model = build(cfg)
        with torch.no_grad():
            stds[variant] = model.blocks[0].attn.out_proj(x).std().item()
    assert abs(stds["hadamard"] / stds["dense"] - 1) < 0.1


def test_dense_and_hadamard_tiny_models_both_learn():
    data = torch.arange(25).repeat(8, 1) % 11
    for variant in ("dense", "hadamard"):
        torch.manual_seed(0)
        model = build(ModelConfig(size="nano", vocab_size=64, block_size=32, attn_out=variant))
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        first = last = None
        for _ in range(60):
            loss = model(data[:, :-1], data[:, 1:]).loss
            opt.zero_grad()
            loss.backward()
            opt.step()
            first = first if first is not None else loss.item()
            last = loss.item()
        assert last < 0.25 * first, (variant, first, last)
