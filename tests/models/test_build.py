"""build_materialised: the model built on the meta device and placed module by module has
the plain fp32 build's initial values bit for bit, for every mechanism."""

from __future__ import annotations

import pytest
import torch

from scalelab.models import catalog
from scalelab.models.build import build, build_materialised
from scalelab.models.config import ModelConfig

CONFIGS = {v: catalog.variant_fields(v) for v in catalog.variants()} | {
    "classify": {"task": "classify", "n_classes": 3},
    "mup": {"parametrization": "mup", "mup_base_width": 32, **catalog.variant_fields("hadamard")},
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_materialised_build_equals_the_fp32_build(name: str) -> None:
    cfg = ModelConfig.model_validate(
        {"size": "nano", "vocab_size": 300, "block_size": 32, **CONFIGS[name]}
    )
    torch.manual_seed(7)
    plain = build(cfg)
    after_plain = torch.get_rng_state()
    torch.manual_seed(7)
    placed = build_materialised(cfg, "cpu", torch.bfloat16)

    assert torch.equal(torch.get_rng_state(), after_plain), "the same draws were made"
    want, got = plain.state_dict(), placed.state_dict()
    assert want.keys() == got.keys()
    for key, value in want.items():
        assert got[key].dtype == torch.bfloat16
        assert torch.equal(got[key], value.to(torch.bfloat16)), key
    if cfg.task == "lm":
        assert placed.lm_head.weight is placed.wte.weight  # still tied
        assert placed.wte.weight.shape[0] == 320  # padded to a multiple of 64
    assert placed.num_params() == plain.num_params()
