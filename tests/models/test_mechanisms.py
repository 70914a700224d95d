"""Every registered mechanism keeps its declarations (models/mechanism.py): the counts match
the built module and torch's FLOP counter, the logged names match the declared ones."""

import pytest
import torch
from pydantic import ValidationError
from rezero_mechanism import ReZero, ReZeroConfig
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from scalelab.contract.config import format_config_error
from scalelab.models import catalog
from scalelab.models.build import build
from scalelab.models.config import ModelConfig
from scalelab.models.dense import AllBlocks
from scalelab.models.flops import count_params, forward_flops_per_token
from scalelab.models.mechanism import (
    Mechanism,
    MechanismConfig,
    Seam,
    mechanism_of,
    register,
    registered,
    unregister,
)

B, T = 2, 32


def mechanism_configs() -> list[ModelConfig]:
    with registered(ReZero):
        names = [m.name for m in catalog.mechanisms()]
        return [ModelConfig(size="nano", vocab_size=256, block_size=T, **{n: {}}) for n in names]


@pytest.fixture(params=mechanism_configs(), ids=lambda cfg: cfg.variant)
def cfg(request) -> ModelConfig:
    return request.param


def test_declared_parameter_count_is_the_built_modules(cfg):
    assert count_params(cfg) == build(cfg).num_params()


def test_declared_flops_match_the_flop_counter(cfg):
    model = build(cfg).train()  # soft training: every part runs
    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter, sdpa_kernel([SDPBackend.MATH]):
        model(torch.randint(0, cfg.vocab_size, (B, T)))
    analytic = forward_flops_per_token(cfg, seq_len=T).matmul * B * T
    assert analytic == pytest.approx(counter.get_total_flops(), rel=0.02)


def test_logged_metrics_and_losses_are_the_declared_ones(cfg):
    (mechanism,) = [mechanism_of(c) for c in cfg.mechanisms.values()]
    model = build(cfg)
    idx = torch.randint(0, cfg.vocab_size, (B, T))
    trained = model.train()(idx, idx)
    assert set(trained.metrics) == set(mechanism.metrics)
    assert set(trained.aux_losses) == set(mechanism.losses)
    with torch.no_grad():
        assert set(model.eval()(idx).metrics) <= set(mechanism.metrics)


def test_variant_names_round_trip_and_keep_one_mechanism_per_seam():
    with registered(ReZero):
        names = catalog.variants()
        assert "tsa+rezero" not in names and "rezero" in names  # both route depth
        for name in names:
            settings = {
                k: v for k, v in catalog.variant_settings(name, {}).items() if v is not None
            }
            assert ModelConfig(size="nano", **settings).variant == name
        assert catalog.canonical_variant("rezero+hadamard") == "hadamard+rezero"
        with pytest.raises(ValueError, match="unknown variant 'tsa\\+rezero'"):
            catalog.canonical_variant("tsa+rezero")
        with pytest.raises(ValidationError, match="tsa and rezero both replace the depth_routing"):
            ModelConfig(size="nano", tsa={}, rezero={})


def test_register_refuses_bad_declarations():
    class Unnamed(Mechanism, AllBlocks):
        name = "Re Zero"
        config = ReZeroConfig
        order = 30  # tsa's
        metrics = ("gate",)

    with pytest.raises(ValueError) as info:
        register(Unnamed)
    message = str(info.value)
    for problem in ("must match", "order 30 is taken", "'gate' must start with"):
        assert problem in message

    class Field(Mechanism, AllBlocks):
        name, config, order = "dropout", MechanismConfig, 99

    with pytest.raises(ValueError, match="'dropout' is a model field"):
        register(Field)


def test_a_class_defined_with_a_registered_mechanisms_config_does_not_take_its_place():
    """A class that reuses ReZeroConfig (as the refused `Unnamed` above does) is defined, not
    registered: a model with `rezero` still builds ReZero's gates (before, the last class
    defined with a config answered for it, and later tests built dense blocks)."""

    class Reused(Mechanism, AllBlocks):
        name, config, order = "reused", ReZeroConfig, 902

    with registered(ReZero):
        cfg = ModelConfig(size="nano", rezero={})
        assert type(cfg.component(Seam.DEPTH_ROUTING)) is ReZero
        assert build(cfg, device="meta").depth.attn_gate.numel() == cfg.n_layer


def test_registration_is_undone_after_the_block():
    with registered(ReZero):
        assert ModelConfig(size="nano", rezero={"init": 0.5}).rezero.init == 0.5
    assert "rezero" not in catalog.variants()
    with pytest.raises(ValidationError) as info:
        ModelConfig(size="nano", rezero={})
    (line,) = format_config_error(info.value, "cfg.yaml").splitlines()
    assert line.startswith("cfg.yaml: rezero: unknown key (allowed: ") and "tsa" in line


def test_the_catalog_answers_from_the_registry_as_it_is_now():
    from scalelab.models.tsa import TokenSelective

    catalog.mechanisms()  # the built-ins are registered
    unregister("tsa")
    try:
        assert "tsa" not in catalog.variants() and catalog.get("tsa") is None
    finally:
        register(TokenSelective)
    assert "budget+tsa" in catalog.variants()
