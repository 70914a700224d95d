import math

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from scalelab.contract.config import format_config_error
from scalelab.jobs.data.synthetic.sequence_tasks import answer_accuracy, sequence_task_batch
from scalelab.models.build import build
from scalelab.models.config import ModelConfig
from scalelab.models.context import ForwardContext
from scalelab.models.early_exit import early_exit_logits, threshold_for_active_fraction
from scalelab.models.flops import count_params
from scalelab.models.tsa_counts import tlops_saved, tsa_router_hidden
from scalelab.models.tsa_layers import (
    MAX_ACTIVE_FRACTION,
    MIN_SKIPPED_TOKENS,
    TokenSelectiveDepth,
    use_sparse_ffn,
)

VOCAB, T = 64, 24


def tsa_cfg(**tsa) -> ModelConfig:
    return ModelConfig(size="micro", vocab_size=VOCAB, block_size=32, tsa=tsa)


def spread_routers(model: torch.nn.Module, std: float = 3.0) -> None:
    """Centre the halt probabilities on 0.5 with a wide spread: many tokens halt."""
    for router in model.depth.routers:
        torch.nn.init.zeros_(router.out.bias)
        torch.nn.init.normal_(router.out.weight, std=std)


def binary_gate_reference(model: torch.nn.Module, idx: torch.Tensor) -> torch.Tensor:
    """Every block on every token, updates masked by [p <= threshold]: what sparse
    inference must equal."""
    ctx = ForwardContext()
    x = model.wte(idx) + model.wpe(torch.arange(idx.size(1)))
    x = model.blocks[0](x, ctx)
    for router, block in zip(model.depth.routers, model.blocks[1:], strict=True):
        g = (router(x) <= model.depth.threshold).float().unsqueeze(-1)
        x = x + g * block.attn_update(x, ctx)
        x = x + g * block.mlp_update(x)
    return model.readout(x)


# --- configuration --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"tsa": {"lambda_depth": -0.1}}, "tsa.lambda_depth: must be >= 0"),
        ({"tsa": {"threshold": 0.0}}, "tsa.threshold: must be in (0, 1), got 0.0"),
        ({"tsa": {"threshold": 1.5}}, "tsa.threshold: must be in (0, 1), got 1.5"),
        ({"tsa": {}, "n_layer": 1}, "tsa needs n_layer >= 2"),
    ],
)
def test_bad_tsa_settings_are_clear_config_errors(kwargs, expected):
    with pytest.raises(ValidationError) as info:
        ModelConfig(size="nano", **kwargs)
    assert expected in format_config_error(info.value, "x.yaml")


def test_one_layer_dense_model_is_still_fine():
    assert ModelConfig(size="nano", n_layer=1).n_layer == 1


# --- structure and initialisation -----------------------------------------------------------


@pytest.mark.parametrize("size", ["nano", "micro", "mini", "124M", "1.3B"])
def test_parameter_count_and_router_width_match_the_analytic_model(size):
    cfg = ModelConfig(size=size, tsa={})
    model = build(cfg, device="meta")
    assert model.num_params() == count_params(cfg)
    routers = model.depth.routers
    assert len(routers) == cfg.n_layer - 1
    assert routers[0].fc.out_features == max(16, cfg.d_model // 4) == tsa_router_hidden(cfg.d_model)


def test_routers_start_near_p_027_and_training_metrics_follow_the_formula():
    torch.manual_seed(0)
    model = build(tsa_cfg(lambda_depth=0.1)).train()
    idx = torch.randint(0, VOCAB, (4, T))
    out = model(idx, idx)
    alpha = out.metrics["tsa/alpha"].item()
    assert alpha == pytest.approx(1 - 1 / (1 + math.e), abs=0.01)  # 1 - sigmoid(-1)
    L = model.cfg.n_layer
    assert out.metrics["tsa/tlops_saved"].item() == pytest.approx(1 - (1 + (L - 1) * alpha) / L)
    # L = L_task + lambda * mean(1 - p)
    assert out.aux_losses["tsa/depth"].item() == pytest.approx(0.1 * alpha, rel=1e-5)
    assert out.loss.item() == pytest.approx(out.task_loss.item() + 0.1 * alpha, rel=1e-5)
    out.loss.backward()
    assert model.depth.routers[0].fc.weight.grad.abs().sum() > 0  # soft gates are trained


def test_tlops_saved_counts_block_zero_as_always_active():
    assert tlops_saved(1.0, 6) == 0.0
    assert tlops_saved(0.0, 6) == pytest.approx(5 / 6)
    assert tlops_saved(0.341, 4) == pytest.approx(1 - (1 + 3 * 0.341) / 4)


# --- soft training --------------------------------------------------------------------------


def test_soft_gating_with_p_zero_is_the_dense_model():
    torch.manual_seed(0)
    dense = build(ModelConfig(size="micro", vocab_size=VOCAB, block_size=32)).train()
    tsa = build(tsa_cfg()).train()
    missing, unexpected = tsa.load_state_dict(dense.state_dict(), strict=False)
    assert all(k.startswith("depth.routers") for k in missing) and not unexpected
    for router in tsa.depth.routers:  # p = sigmoid(-1e4) = 0 exactly
        torch.nn.init.zeros_(router.out.weight)
        torch.nn.init.constant_(router.out.bias, -1e4)
    idx = torch.randint(0, VOCAB, (3, T))
    out = tsa(idx, idx)
    assert torch.allclose(out.logits, dense(idx).logits, atol=1e-6)
    assert out.metrics["tsa/alpha"].item() == 1.0


# --- sparse inference -----------------------------------------------------------------------


@pytest.mark.parametrize("path", ["sparse", "dense"])
def test_sparse_inference_equals_the_dense_computation_with_the_same_binary_gates(path):
    torch.manual_seed(0)
    model = build(tsa_cfg()).eval()
    spread_routers(model)
    model.depth.force_path = path
    idx = torch.randint(0, VOCAB, (4, T))
    with torch.no_grad():
        out = model(idx)
        reference = binary_gate_reference(model, idx)
    assert torch.allclose(out.logits, reference, atol=1e-5)
    alpha = out.metrics["tsa/alpha"].item()
    assert 0.2 < alpha < 0.8  # the comparison covers halted and active tokens


def test_halting_every_token_runs_block_zero_only():
    torch.manual_seed(0)
    model = build(tsa_cfg()).eval()
    for router in model.depth.routers:
        torch.nn.init.constant_(router.out.bias, 20.0)  # p ~ 1 everywhere
    idx = torch.randint(0, VOCAB, (2, T))
    with torch.no_grad():
        out = model(idx)
        x = model.wte(idx) + model.wpe(torch.arange(T))
        block_zero_only = model.readout(model.blocks[0](x, ForwardContext()))
    assert torch.allclose(out.logits, block_zero_only, atol=1e-6)
    assert out.metrics["tsa/alpha"].item() == 0.0
    assert out.metrics["tsa/tlops_saved"].item() == pytest.approx(1 - 1 / model.cfg.n_layer)


def test_sparse_path_is_causal():
    torch.manual_seed(0)
    model = build(tsa_cfg()).eval()
    spread_routers(model)
    model.depth.force_path = "sparse"
    idx = torch.randint(0, VOCAB, (3, T))
    changed = idx.clone()
    changed[:, 11:] = (changed[:, 11:] + 7) % VOCAB
    with torch.no_grad():
        a, b = model(idx).logits, model(changed).logits
    assert torch.allclose(a[:, :11], b[:, :11], atol=1e-5)
    assert not torch.allclose(a[:, 11:], b[:, 11:], atol=1e-3)


def test_eval_without_sparse_inference_keeps_the_soft_gates():
    torch.manual_seed(0)
    model = build(tsa_cfg(sparse_inference=False))
    idx = torch.randint(0, VOCAB, (2, T))
    with torch.no_grad():
        soft_train = model.train()(idx).logits
        soft_eval = model.eval()(idx).logits
    assert torch.allclose(soft_train, soft_eval)


def test_dense_fallback_rule():
    # too few skipped tokens to pay for the gather/scatter, whatever the fraction
    assert not use_sparse_ffn(n_active=0, n_tokens=MIN_SKIPPED_TOKENS - 1)
    assert use_sparse_ffn(n_active=0, n_tokens=MIN_SKIPPED_TOKENS)
    # nearly every token active: the skipped FFN rows do not pay for copying the others
    n = 10_000
    assert use_sparse_ffn(n_active=int(MAX_ACTIVE_FRACTION * n), n_tokens=n)
    assert not use_sparse_ffn(n_active=int(MAX_ACTIVE_FRACTION * n) + 1, n_tokens=n)
    # batch 1 x 256 at the paper's alpha ~ 0.73 takes the sparse path
    assert use_sparse_ffn(n_active=187, n_tokens=256)
    # the module applies the rule to its binary gates
    depth = TokenSelectiveDepth(tsa_cfg(), tsa_cfg().tsa)
    few_halted = torch.ones(1, 256, dtype=torch.bool)
    few_halted[0, : MIN_SKIPPED_TOKENS - 1] = False
    assert depth._path(few_halted) == "dense"
    many_halted = torch.rand(8, 256, generator=torch.Generator().manual_seed(0)) < 0.7
    assert depth._path(many_halted) == "sparse"
    assert depth._path(torch.ones(8, 256, dtype=torch.bool)) == "dense"


# --- early-exit baseline --------------------------------------------------------------------


def confident_dense_model() -> torch.nn.Module:
    """A dense LM whose intermediate read-outs spread over the whole confidence range: with
    tied embeddings of std 0.03 a token's own embedding gives a logit margin of about
    d * 0.03^2 / 0.03 ~ 4, so the max softmax probability varies from token to token."""
    torch.manual_seed(0)
    model = build(ModelConfig(size="micro", vocab_size=VOCAB, block_size=32)).eval()
    torch.nn.init.normal_(model.wte.weight, std=0.03)
    return model


def test_early_exit_extremes():
    model = confident_dense_model()
    idx = torch.randint(0, VOCAB, (2, T))
    never = early_exit_logits(model, idx, threshold=1.1)
    with torch.no_grad():
        assert torch.allclose(never.logits, model(idx).logits, atol=1e-5)
        x = model.wte(idx) + model.wpe(torch.arange(T))
        after_block_zero = model.readout(model.blocks[0](x, ForwardContext()))
    assert never.alpha == 1.0 and never.tlops_saved == 0.0
    always = early_exit_logits(model, idx, threshold=1e-6)
    assert always.alpha == 0.0 and bool((always.exit_layer == 0).all())
    assert torch.allclose(always.logits, after_block_zero, atol=1e-5)


def test_early_exit_is_causal_and_bisection_matches_the_target_fraction():
    model = confident_dense_model()
    idx = torch.randint(0, VOCAB, (8, T))
    for target in (0.5, 0.75):
        threshold = threshold_for_active_fraction(model, idx, target)
        assert early_exit_logits(model, idx, threshold).alpha == pytest.approx(target, abs=0.03)
    threshold = threshold_for_active_fraction(model, idx, 0.6)
    changed = idx.clone()
    changed[:, 11:] = (changed[:, 11:] + 7) % VOCAB
    a = early_exit_logits(model, idx, threshold).logits
    b = early_exit_logits(model, changed, threshold).logits
    assert torch.allclose(a[:, :11], b[:, :11], atol=1e-5)


# --- the paper's synthetic claim: routing proportional to difficulty -----------------------


def train_on_sequence_task(task: str, seed: int = 0, steps: int = 200) -> tuple[float, float]:
    """A 4-layer d=64 TSA model trained with lambda = 0.01; returns (answer accuracy, alpha
    executed by sparse inference) on fresh examples."""
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    cfg = ModelConfig(
        size="nano", n_layer=4, d_model=64, n_head=4, vocab_size=32, block_size=20,
        tsa={"lambda_depth": 0.01},
    )  # fmt: skip
    model = build(cfg).train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-3, total_steps=steps)
    for _ in range(steps):
        x, y = map(torch.from_numpy, sequence_task_batch(task, 64, rng))
        loss = model(x, y).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        schedule.step()
    x, y = sequence_task_batch(task, 512, np.random.default_rng(seed + 1000))
    with torch.no_grad():
        out = model.eval()(torch.from_numpy(x))
    return answer_accuracy(out.logits.argmax(-1).numpy(), y), out.metrics["tsa/alpha"].item()


@pytest.mark.slow
def test_routing_is_proportional_to_difficulty_copy_skips_more_than_sort():
    torch.set_num_threads(1)
    copy_accuracy, copy_alpha = train_on_sequence_task("copy")
    _, sort_alpha = train_on_sequence_task("sort")
    assert copy_accuracy >= 0.95  # no loss of accuracy ...
    assert copy_alpha < 0.6  # ... while most routed token-layers are skipped
    assert sort_alpha > copy_alpha + 0.2  # the harder task keeps more of its depth
