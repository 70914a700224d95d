import pytest
from pydantic import ValidationError

from scalelab.contract.config import format_config_error
from scalelab.models import catalog
from scalelab.models.config import ModelConfig
from scalelab.models.sizes import SIZES


def _error_lines(**kwargs) -> list[str]:
    with pytest.raises(ValidationError) as info:
        ModelConfig(**kwargs)
    return format_config_error(info.value, "cfg.yaml").splitlines()


def test_unknown_preset_names_the_field_and_lists_presets():
    (line,) = _error_lines(size="gpt-9000")
    assert line.startswith("cfg.yaml: size: unknown size preset 'gpt-9000'")
    for name in SIZES:
        assert name in line


def test_head_count_must_divide_width():
    (line,) = _error_lines(size="nano", n_head=5)
    assert "d_model=64 is not divisible by n_head=5" in line
    assert "[1, 2, 4, 8, 16, 32, 64]" in line


def test_unknown_key_lists_allowed_keys_at_every_depth():
    lines = _error_lines(size="nano", colour="red", tsa={"lambda": 0.1})
    assert any(ln.startswith("cfg.yaml: colour: unknown key (allowed: ") for ln in lines)
    nested = next(ln for ln in lines if ln.startswith("cfg.yaml: tsa.lambda"))
    assert "lambda_depth" in nested and "threshold" in nested


def test_wrong_literal_names_allowed_values():
    (line,) = _error_lines(size="nano", attn_out="fourier")
    assert line.startswith("cfg.yaml: attn_out:") and "'dense'" in line and "'hadamard'" in line


def test_preset_fills_architecture_and_overrides_win():
    cfg = ModelConfig(size="124M")
    assert (cfg.n_layer, cfg.d_model, cfg.n_head) == (12, 768, 12)
    cfg = ModelConfig(size="124M", n_layer=3)
    assert (cfg.n_layer, cfg.d_model) == (3, 768)
    # the resolved values are part of the dump, so a trial's JSON is self-contained
    assert ModelConfig(**ModelConfig(size="nano").model_dump()) == ModelConfig(size="nano")


def test_configs_are_frozen():
    cfg = ModelConfig(size="nano")
    with pytest.raises(ValidationError):
        cfg.n_layer = 3


def test_classification_needs_classes():
    assert any("n_classes >= 2" in ln for ln in _error_lines(size="nano", task="classify"))
    assert not ModelConfig(size="nano", task="classify", n_classes=4).causal


def test_every_preset_width_has_a_hadamard_matrix():
    for name in SIZES:
        assert ModelConfig(size=name, attn_out="hadamard").variant == "hadamard"


def test_variant_names_round_trip():
    for name in catalog.variants():
        cfg = ModelConfig(size="nano", **catalog.variant_fields(name))
        assert cfg.variant == name
    assert catalog.canonical_variant("tsa+hadamard") == "hadamard+tsa"
    with pytest.raises(ValueError, match="unknown variant"):
        catalog.canonical_variant("hadamard+moe")
