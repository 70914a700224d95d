"""Init and per-layer learning rates by width role: the standard parametrisation and µP."""

import math

import pytest
import torch
from pydantic import ValidationError

from scalelab.contract.config import format_config_error
from scalelab.jobs.config import TrainConfig
from scalelab.jobs.training.optim import adamw, set_lr
from scalelab.models import catalog
from scalelab.models.build import build
from scalelab.models.config import ModelConfig
from scalelab.models.parametrization import attention_scale, logit_scale, width_mult

VOCAB = 64


def cfg(d: int, mup_base: int | None = None, variant: str = "dense", **kw) -> ModelConfig:
    extra = {"parametrization": "mup", "mup_base_width": mup_base} if mup_base else {}
    return ModelConfig(
        size="nano", n_layer=2, d_model=d, n_head=4, vocab_size=VOCAB, block_size=32,
        **catalog.variant_fields(variant), **extra, **kw,
    )  # fmt: skip


def groups_by_param(opt: torch.optim.Optimizer) -> dict[int, dict]:
    return {id(p): g for g in opt.param_groups for p in g["params"]}


@pytest.mark.parametrize("d", [128, 256])
def test_standard_init_is_fan_in_with_gpt2_residual_projections(d):
    torch.manual_seed(0)
    model = build(ModelConfig(size="micro", d_model=d, vocab_size=VOCAB, block_size=32))
    block = model.blocks[0]
    fan_in = 1 / math.sqrt(3 * d)  # PyTorch's nn.Linear variance: 0.051 at d 128
    assert block.attn.c_attn.weight.std().item() == pytest.approx(fan_in, rel=0.05)
    assert block.mlp.c_fc.weight.std().item() == pytest.approx(fan_in, rel=0.05)
    residual = 0.02 / math.sqrt(2 * 4)
    assert block.attn.out_proj.weight.std().item() == pytest.approx(residual, rel=0.05)
    assert block.mlp.c_proj.weight.std().item() == pytest.approx(residual, rel=0.05)
    assert model.wte.weight.std().item() == pytest.approx(0.02, rel=0.05)


def test_mup_at_its_base_width_is_the_standard_model():
    models, opts = [], []
    for base in (None, 128):
        torch.manual_seed(0)
        model = build(cfg(128, base, "hadamard+budget+tsa"))
        models.append(model)
        opts.append(adamw(model, TrainConfig(tokens=1, lr=1e-3)))
    sp, mup = models
    for (name, a), (_, b) in zip(sp.state_dict().items(), mup.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    idx = torch.randint(0, VOCAB, (2, 16))
    assert torch.allclose(sp.eval()(idx).logits, mup.eval()(idx).logits, atol=1e-6)
    assert all(g["lr_scale"] == 1.0 for g in opts[1].param_groups)


def test_mup_scales_init_learning_rates_and_multipliers_with_width():
    torch.manual_seed(0)
    wide, narrow = cfg(256, 64, "hadamard+budget+tsa"), cfg(64, 64, "hadamard+budget+tsa")
    sp_wide = cfg(256, None, "hadamard+budget+tsa")
    model, sp = build(wide), build(sp_wide)
    assert width_mult(wide) == 4 and logit_scale(wide) == 0.25
    # q.k scaled by 1/d_head (x sqrt of the base d_head, 16): 4/64 instead of 1/8
    assert attention_scale(wide) == pytest.approx(4 / 64) and attention_scale(sp_wide) is None
    block, sp_block = model.blocks[1], sp.blocks[1]
    # hidden: fan-in already; residual and output layers: x m^-1/2 against standard
    assert block.mlp.c_fc.weight.std().item() == pytest.approx(
        sp_block.mlp.c_fc.weight.std().item(), rel=0.05
    )
    for get in (lambda b: b.mlp.c_proj, lambda b: b.attn.relevance_net):
        assert get(block).weight.std().item() == pytest.approx(
            get(sp_block).weight.std().item() / 2, rel=0.1
        )
    router, sp_router = model.depth.routers[0].out, sp.depth.routers[0].out
    assert router.weight.std().item() == pytest.approx(sp_router.weight.std().item() / 2, rel=0.2)
    # Hadamard's alpha starts where the base width's does: vector-like, width-independent
    assert block.attn.out_proj.alpha_init == pytest.approx(
        build(narrow).blocks[1].attn.out_proj.alpha_init
    )
    group = groups_by_param(adamw(model, TrainConfig(tokens=1, lr=1e-3)))
    scales = {
        "c_attn": group[id(block.attn.c_attn.weight)]["lr_scale"],
        "c_proj": group[id(block.mlp.c_proj.weight)]["lr_scale"],
        "router_out": group[id(router.weight)]["lr_scale"],
        "relevance": group[id(block.attn.relevance_net.weight)]["lr_scale"],
        "budget_last": group[id(block.attn.budget_net[2].weight)]["lr_scale"],
        "wte": group[id(model.wte.weight)]["lr_scale"],
        "alpha": group[id(block.attn.out_proj.alpha)]["lr_scale"],
        "ln": group[id(block.ln_1.weight)]["lr_scale"],
    }
    assert scales == {
        "c_attn": 0.25, "c_proj": 0.25, "router_out": 0.25, "relevance": 0.25,
        "budget_last": 1.0, "wte": 1.0, "alpha": 1.0, "ln": 1.0,
    }  # fmt: skip


def test_weight_decay_only_on_linear_weights_and_set_lr_applies_each_scale():
    model = build(cfg(128, 32))
    opt = adamw(model, TrainConfig(tokens=1, lr=1e-3, weight_decay=0.1))
    group = groups_by_param(opt)
    assert sum(len(g["params"]) for g in opt.param_groups) == len(list(model.parameters()))
    assert group[id(model.wte.weight)]["weight_decay"] == 0.0  # and so the tied head
    assert group[id(model.wpe.weight)]["weight_decay"] == 0.0
    assert group[id(model.blocks[0].ln_1.weight)]["weight_decay"] == 0.0
    assert group[id(model.blocks[0].attn.c_attn.bias)]["weight_decay"] == 0.0
    assert group[id(model.blocks[0].attn.c_attn.weight)]["weight_decay"] == 0.1
    set_lr(opt, 2e-3)
    assert group[id(model.blocks[0].mlp.c_fc.weight)]["lr"] == pytest.approx(2e-3 / 4)
    assert group[id(model.wte.weight)]["lr"] == pytest.approx(2e-3)


def test_weight_decay_on_all_decays_every_parameter_and_keeps_the_lr_scales():
    model = build(cfg(128, 32))
    opt = adamw(model, TrainConfig(tokens=1, lr=1e-3, weight_decay=0.1, weight_decay_on="all"))
    group = groups_by_param(opt)
    assert {id(p) for p in model.parameters()} <= group.keys()
    assert {g["weight_decay"] for g in opt.param_groups} == {0.1}
    set_lr(opt, 2e-3)
    assert group[id(model.blocks[0].mlp.c_fc.weight)]["lr"] == pytest.approx(2e-3 / 4)
    assert group[id(model.blocks[0].ln_1.weight)]["lr"] == pytest.approx(2e-3)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"parametrization": "mup"}, "mup_base_width goes with parametrization='mup'"),
        ({"mup_base_width": 64}, "mup_base_width goes with parametrization='mup'"),
        ({"parametrization": "mup", "mup_base_width": 0}, "mup_base_width: must be a positive"),
        ({"parametrization": "mu"}, "parametrization: Input should be 'standard' or 'mup'"),
    ],
)
def test_bad_parametrization_settings_are_clear_config_errors(kwargs, message):
    with pytest.raises(ValidationError) as info:
        ModelConfig(size="nano", **kwargs)
    assert message in format_config_error(info.value, "sweep.yaml")


# --- the coordinate check (Yang et al. 2021, "Tensor Programs V", section 7) ---------------


def coordinate_changes(config: ModelConfig, steps: int = 4, lr: float = 3e-3) -> dict[str, float]:
    """Mean |coordinate| of how much each layer's output moved after `steps` Adam steps on
    one fixed batch: the embedding, every block's attention and FFN, and the logits."""
    torch.manual_seed(0)
    model = build(config)
    opt = adamw(model, TrainConfig(tokens=1, lr=lr, weight_decay=0.0))
    set_lr(opt, lr)
    idx = torch.randint(0, VOCAB, (8, 33), generator=torch.Generator().manual_seed(1))
    x, y = idx[:, :-1], idx[:, 1:]
    layers = {"embedding": model.drop}
    for i, block in enumerate(model.blocks):
        layers |= {f"attn{i}": block.attn, f"ffn{i}": block.mlp}

    def outputs() -> dict[str, torch.Tensor]:
        seen: dict[str, torch.Tensor] = {}
        hooks = [
            m.register_forward_hook(lambda m, i, o, n=n: seen.__setitem__(n, o.detach()))
            for n, m in layers.items()
        ]
        with torch.no_grad():  # training mode, no exploration noise without gradients
            seen["logits"] = model(x).logits
        for h in hooks:
            h.remove()
        return seen

    before = outputs()
    for _ in range(steps):
        opt.zero_grad()
        model(x, y).loss.backward()
        opt.step()
    after = outputs()
    return {name: (after[name] - before[name]).abs().mean().item() for name in before}


@pytest.mark.parametrize("variant", ["dense", "hadamard+budget+tsa"])
def test_coordinate_check_flat_under_mup_and_growing_under_standard(variant):
    """Slope of log(change) against log(width) over widths 32 .. 256 for every layer: under
    µP every layer stays within |slope| < 0.35 (measured -0.26 .. 0.03, the logits' the
    lowest); under the standard parametrisation every attention and FFN output grows with
    width (measured 0.81 .. 1.45 dense, 0.56 .. 0.78 with all three mechanisms)."""
    widths = (32, 64, 128, 256)
    slopes = {}
    for name, base in (("standard", None), ("mup", 32)):
        runs = [coordinate_changes(cfg(w, base, variant)) for w in widths]
        slopes[name] = {
            layer: math.log(runs[-1][layer] / runs[0][layer]) / math.log(widths[-1] / widths[0])
            for layer in runs[0]
        }
    assert all(abs(s) < 0.35 for s in slopes["mup"].values()), slopes["mup"]
    hidden = {k: v for k, v in slopes["standard"].items() if k.startswith(("attn", "ffn"))}
    assert len(hidden) == 4 and all(s > 0.45 for s in hidden.values()), slopes["standard"]
