import pytest

from scalelab.models.build import build
from scalelab.models.config import ModelConfig
from scalelab.models.flops import count_params
from scalelab.models.sizes import SIZES

PAPER_LADDER = {"124M": 124e6, "350M": 350e6, "760M": 760e6, "1.3B": 1.3e9, "2.7B": 2.7e9}


def test_gpt2_small_has_exactly_124_439_808_parameters():
    cfg = ModelConfig(size="124M", vocab_size=50257, block_size=1024, bias=True)
    assert count_params(cfg) == 124_439_808
    assert build(cfg, device="meta").num_params() == 124_439_808


@pytest.mark.parametrize("name", list(SIZES))
def test_analytic_count_matches_built_module(name):
    cfg = ModelConfig(size=name)
    model = build(cfg, device="meta")
    assert count_params(cfg) == model.num_params()
    assert count_params(cfg, non_embedding=True) == model.num_params(non_embedding=True)


def test_ladder_matches_its_names():
    for name, target in PAPER_LADDER.items():
        n = count_params(ModelConfig(size=name))
        assert abs(n - target) / target < 0.12, (name, n)
    assert abs(count_params(ModelConfig(size="5.6B")) - 5.6e9) <= 0.1e9


def test_cpu_presets_are_tiny():
    for preset in SIZES.values():
        if preset.cpu_sized:
            assert count_params(ModelConfig(size=preset.name, vocab_size=256)) < 10e6
