import math

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from scalelab.contract.config import format_config_error
from scalelab.models.budget import BudgetConfig
from scalelab.models.budget_flops import budget_inference_flops, budget_net_flops
from scalelab.models.budget_layers import BudgetAttention, budget_decisions, schedule
from scalelab.models.build import build
from scalelab.models.config import ModelConfig
from scalelab.models.context import ForwardContext
from scalelab.models.flops import count_params

VOCAB = 64


def cfg_for(task: str = "lm", attn_out: str = "dense", **budget) -> ModelConfig:
    extra = {"task": "classify", "n_classes": 3} if task == "classify" else {}
    return ModelConfig(
        size="nano",
        n_head=8,
        vocab_size=VOCAB,
        block_size=32,
        attn_out=attn_out,
        budget=budget,
        **extra,
    )


def spread_decisions(attn: BudgetAttention, s_bias: float = 0.0, seed: int = 0) -> None:
    """Make s and the relevance vary strongly between inputs (at init s is constant): every
    decision weight drawn here from its own generator, so the decisions do not depend on
    the model's init rule or on the global random stream."""
    g = torch.Generator().manual_seed(seed)
    # a small first layer: s spreads over (0, 1) instead of saturating at 0 or 1
    attn.budget_net[0].weight.data.normal_(0.0, 0.02, generator=g)
    attn.relevance_net.weight.data.normal_(0.0, 1.0, generator=g)
    attn.budget_net[2].weight.data.normal_(0.0, 1.0, generator=g)
    torch.nn.init.constant_(attn.budget_net[2].bias, s_bias)


# --- bad input ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("budget", "message"),
    [
        ({"s_min": 0.5, "s_max": 0.5}, "s_min=0.5 must be < s_max=0.5"),
        ({"s_min": 0.6, "s_max": 0.3}, "s_min=0.6 must be < s_max=0.3"),
        ({"s_max": 1.0}, "budget.s_max: a head fraction must be in (0, 1), got 1.0"),
        ({"s_min": 0.0}, "budget.s_min: a head fraction must be in (0, 1), got 0.0"),
        ({"tau_schedule": "step"}, "budget.tau_schedule:"),
        ({"entropy_schedule": "warmup"}, "budget.entropy_schedule:"),
        ({"tau_start": 0.1, "tau_end": 1.0}, "tau_end=1.0 must be <= tau_start=0.1"),
        ({"cost_weight": -1.0}, "budget.cost_weight: must be >= 0"),
        ({"cost_warmup": 1.5}, "budget.cost_warmup: a fraction of training must be in [0, 1]"),
    ],
)
def test_bad_budget_settings_are_clear_config_errors(budget, message):
    with pytest.raises(ValidationError) as info:
        ModelConfig(size="nano", budget=budget)
    text = format_config_error(info.value, "sweep.yaml")
    assert message in text and text.startswith("sweep.yaml: ")
    if "schedule" in message:
        assert "'linear'" in text and "'cosine'" in text  # the allowed names are listed


def test_a_single_head_cannot_be_budgeted():
    with pytest.raises(ValidationError, match="budget needs n_head >= 2"):
        ModelConfig(size="nano", n_head=1, budget={})
    ModelConfig(size="nano", n_head=1)  # fine without a budget


def test_schedules_anneal_from_exploration_to_exploitation():
    b = BudgetConfig()
    for name in ("linear", "cosine", "exponential"):
        taus = [schedule(name, b.tau_start, b.tau_end, t) for t in np.linspace(0, 1, 11)]
        assert taus[0] == pytest.approx(b.tau_start) and taus[-1] == pytest.approx(b.tau_end)
        assert all(a > c for a, c in zip(taus, taus[1:], strict=False))
    # default entropy weight: rewards spread (negative) early, penalises entropy late
    early = schedule(b.entropy_schedule, b.entropy_weight_start, b.entropy_weight_end, 0.0)
    late = schedule(b.entropy_schedule, b.entropy_weight_start, b.entropy_weight_end, 1.0)
    assert early < 0 < late


# --- the relaxation ----------------------------------------------------------------------


def random_decisions(n: int, H: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    s = torch.rand(n, 1, generator=g) * 0.98 + 0.01
    frac = (s * H) % 1.0
    s = torch.where((frac < 0.05) | (frac > 0.95), s + 0.3 / H, s).clamp(max=0.99)
    return s, torch.randn(n, 1, H, generator=g) * 2.0


def test_soft_mask_becomes_the_hard_inference_mask_as_tau_goes_to_zero():
    attn = build(cfg_for()).blocks[0].attn
    s, r = random_decisions(512, attn.n_head)
    k, hard = attn.hard_mask(s, r)
    mean_errors = []
    for tau in (1.0, 0.1, 1e-2, 1e-4):
        soft = attn.soft_mask(s, r, tau, noise=False)
        mean_errors.append((soft - hard.float()).abs().mean().item())
    assert (soft - hard.float()).abs().max().item() < 1e-3  # every entry, at tau = 1e-4
    assert mean_errors[0] > 0.1 and mean_errors == sorted(mean_errors, reverse=True)
    assert torch.equal(hard.sum(-1), k)  # exactly k heads, the k most relevant
    top = r.topk(int(k[0, 0]), dim=-1).indices[0, 0]
    assert hard[0, 0, top].all()


def test_high_temperature_is_near_uniform_over_heads():
    attn = build(cfg_for()).blocks[0].attn
    s, r = random_decisions(256, attn.n_head, seed=1)
    r = r * 0.5
    m = attn.soft_mask(s, r, tau=50.0, noise=False)
    assert (m.amax(-1) - m.amin(-1)).max() < 0.05


def test_at_least_one_head_runs_however_small_the_budget():
    attn = build(cfg_for()).blocks[0].attn
    s = torch.tensor([[1e-4], [0.05], [0.124], [0.99]])
    r = torch.randn(4, 1, attn.n_head)
    k, hard = attn.hard_mask(s, r)
    assert k.flatten().tolist() == [1, 1, 1, 7]
    assert (hard.sum(-1) == k).all()
    soft = attn.soft_mask(s, r, tau=1e-4, noise=False)
    assert torch.allclose(soft, hard.float(), atol=1e-3)


# --- inference computes only the selected heads ------------------------------------------


@pytest.mark.parametrize("shared", [False, True], ids=["own-heads", "shared-heads"])
@pytest.mark.parametrize("attn_out", ["dense", "hadamard"])
@pytest.mark.parametrize("task", ["lm", "classify"])
def test_gathered_heads_equal_the_masked_all_heads_computation(task, attn_out, shared):
    torch.manual_seed(0)
    attn = build(cfg_for(task, attn_out)).blocks[0].attn.eval()
    # seed 1: seed 0 gives the Hadamard LM case an example with k = 7 at every position (the
    # per-token precondition at the end fails); seeds 1, 2, 3 meet every precondition
    spread_decisions(attn, seed=1)
    if shared:  # one head set for every decision: the single-GEMM path
        torch.nn.init.zeros_(attn.relevance_net.weight)
        torch.nn.init.zeros_(attn.budget_net[2].weight)
        torch.nn.init.constant_(attn.budget_net[2].bias, math.log(0.45 / 0.55))
    x = torch.randn(4, 20, 64) + 2 * torch.randn(4, 1, 64)  # examples differ in their mean
    ctx = ForwardContext()
    if task == "classify":
        ctx.pad_mask = torch.arange(20) < torch.tensor([20, 13, 7, 20])[:, None]
    with torch.no_grad():
        s, r = attn.decide(attn.pool(x, ctx))
        k, active = attn.hard_mask(s, r)
        sparse = attn.sparse_forward(x, active, ctx)
        masked = attn.masked_forward(x, active, ctx)
    assert torch.allclose(sparse, masked, atol=1e-5)
    if shared:
        assert (active == active[:1, :1]).all() and (k == 3).all()
        return
    assert k.unique().numel() > 1 and (~active).any()  # decisions really differ
    if task == "lm":  # per-token decisions: heads differ between positions of one sequence
        assert (active[0] != active[0, :1]).any()


@pytest.mark.parametrize("attn_out", ["dense", "hadamard"])
def test_per_token_heads_on_a_long_sequence_equal_the_masked_computation(attn_out):
    """T = 300: the decoder's pair attention runs in position chunks (keys after a chunk are
    skipped); head 0 is chosen by no token, so its K/V are not computed either."""
    torch.manual_seed(0)
    attn = build(cfg_for("lm", attn_out)).blocks[0].attn.eval()
    x = torch.randn(2, 300, 64)
    active = torch.rand(2, 300, 8) < 0.3
    active[..., 0] = False
    active[..., 1] |= ~active.any(-1)  # every token runs at least one head
    with torch.no_grad():
        sparse = attn.sparse_forward(x, active, ForwardContext())
        masked = attn.masked_forward(x, active, ForwardContext())
    assert torch.allclose(sparse, masked, atol=1e-5)


@pytest.mark.parametrize("task", ["lm", "classify"])
def test_hard_inference_equals_training_when_the_training_mask_is_hard(task):
    # Seed-sensitive: a head whose score is within ~tau of the k-th keeps a soft weight in
    # training (3 of seeds 0-11 exceed 1e-4 with today's initialisation, 4 did before the
    # constructors' draws left the RNG stream); seed 1 has no such near-tie.
    torch.manual_seed(1)
    cfg = cfg_for(task, tau_start=1e-4, tau_end=1e-4, gumbel_noise=False)
    model = build(cfg)
    for i, block in enumerate(model.blocks):
        spread_decisions(block.attn, s_bias=math.log(0.6 / 0.4), seed=i)
    idx = torch.randint(0, VOCAB, (3, 24))
    with torch.no_grad():
        train = model.train()(idx).logits
        infer = model.eval()(idx).logits
    assert torch.allclose(train, infer, atol=1e-4)
    ks = [k for k, _ in budget_decisions(model)]
    assert all((k >= 1).all() and (k < 8).all() for k in ks)


def test_noisy_training_stays_causal():
    torch.manual_seed(0)
    model = build(cfg_for()).train()
    idx = torch.randint(0, VOCAB, (2, 24))
    changed = idx.clone()
    changed[:, 11:] = (changed[:, 11:] + 3) % VOCAB
    torch.manual_seed(1)
    a = model(idx).logits
    torch.manual_seed(1)
    b = model(changed).logits
    assert torch.allclose(a[:, :11], b[:, :11], atol=1e-5)


# --- losses, metrics, accounting ---------------------------------------------------------


def test_losses_metrics_and_budget_penalty():
    torch.manual_seed(0)
    cfg = cfg_for("classify", cost_weight=0.0)
    model = build(cfg).train()
    idx, y = torch.randint(0, VOCAB, (4, 16)), torch.tensor([0, 1, 2, 0])
    inside = model(idx, y, progress=0.0)
    assert inside.aux_losses["budget/budget"].item() == pytest.approx(0.0, abs=1e-6)
    assert inside.aux_losses["budget/entropy"].item() < 0  # spread is rewarded early
    for name in ("budget/s_mean", "budget/heads_active", "budget/entropy"):
        assert name in inside.metrics
    for block in model.blocks:  # s ~ 0.98 > s_max = 0.9: the hinge is paid in every layer
        torch.nn.init.constant_(block.attn.budget_net[2].bias, 4.0)
    outside = model(idx, y, progress=1.0)
    n_layer = cfg.n_layer
    assert outside.aux_losses["budget/budget"].item() > 0.07 * n_layer
    assert outside.aux_losses["budget/entropy"].item() > 0
    outside.loss.backward()
    assert model.blocks[0].attn.budget_net[2].bias.grad.item() > 0  # pushes s down


def test_cost_on_s_ramps_up_over_the_warmup_fraction():
    torch.manual_seed(0)
    cfg = cfg_for("classify", cost_weight=0.1, cost_warmup=0.5)
    model = build(cfg).train()
    idx, y = torch.randint(0, VOCAB, (4, 16)), torch.tensor([0, 1, 2, 0])
    costs = {}
    for progress in (0.0, 0.25, 0.5, 1.0):
        out = model(idx, y, progress=progress)
        costs[progress] = out.aux_losses["budget/budget"].item()
    # s starts at 0.5 for every input, inside [s_min, s_max]: only the cost term is paid
    assert costs[0.0] == pytest.approx(0.0, abs=1e-7)
    assert costs[0.25] == pytest.approx(0.5 * costs[0.5], rel=1e-4)
    assert costs[1.0] == pytest.approx(costs[0.5], rel=1e-4)
    assert costs[1.0] == pytest.approx(0.1 * 0.5 * cfg.n_layer, rel=1e-4)


@pytest.mark.parametrize("task", ["lm", "classify"])
@pytest.mark.parametrize("attn_out", ["dense", "hadamard"])
def test_parameter_count_matches_the_built_module(task, attn_out):
    cfg = cfg_for(task, attn_out, budget_hidden=24)
    assert count_params(cfg) == build(cfg, device="meta").num_params()


def test_reported_k_gives_the_executed_flops():
    torch.manual_seed(0)
    model = build(cfg_for("classify")).eval()
    for i, block in enumerate(model.blocks):
        spread_decisions(block.attn, seed=i)
    idx = torch.randint(0, VOCAB, (5, 16))
    out = model(idx)
    decisions = budget_decisions(model)
    assert len(decisions) == 2 and decisions[0][0].shape == (5, 1)
    k = torch.stack([d[0].flatten() for d in decisions]).float()
    assert out.metrics["budget/heads_active"].item() == pytest.approx(k.mean().item() / 8)
    full = budget_inference_flops(model.cfg, [torch.full((5,), 8)] * 2, seq_len=16)
    used = budget_inference_flops(model.cfg, [d[0] for d in decisions], seq_len=16)
    assert 0 < used < full
    # the logged metrics: executed FLOPs per token over all layers, and the ratio to all heads
    assert out.metrics["budget/attn_flops"].item() * 5 * 16 == pytest.approx(used, rel=1e-5)
    plain = full - 2 * 5 * budget_net_flops(model.cfg)  # all heads run no budget nets
    ratio = out.metrics["budget/attn_flops_ratio"].item()
    assert ratio == pytest.approx(used / plain, rel=1e-5) and ratio < 1


def test_training_logs_the_flops_that_inference_would_execute():
    torch.manual_seed(0)
    model = build(cfg_for("lm", tau_start=1e-4, tau_end=1e-4, gumbel_noise=False))
    for i, block in enumerate(model.blocks):
        spread_decisions(block.attn, seed=i)
    idx = torch.randint(0, VOCAB, (3, 24))
    with torch.no_grad():
        train = model.train()(idx).metrics
        infer = model.eval()(idx).metrics
    decisions = budget_decisions(model)
    executed = budget_inference_flops(
        model.cfg, [d[0] for d in decisions], 24, [d[1] for d in decisions]
    )
    assert infer["budget/attn_flops"].item() * 3 * 24 == pytest.approx(executed, rel=1e-5)
    assert train["budget/attn_flops"].item() == pytest.approx(
        infer["budget/attn_flops"].item(), rel=1e-5
    )
    assert 0 < train["budget/attn_flops_ratio"].item() < 1


# --- the paper's qualitative claim -------------------------------------------------------


def train_on_mixed_difficulty(seed: int, steps: int = 600) -> dict[str, torch.Tensor]:
    """A one-layer nano encoder (d=64, 8 heads) trained on the easy/hard task of
    jobs/data/synthetic/classification.py with 2 classes: easy = the class keyword 8 times in 16
    tokens (a bag of words reads it), hard = the XOR of a token pair (attention must read
    one token from the other). The cost on s ramps from 0 to 0.15 over training
    (cost_warmup=1): heads are free while the pair relation is learned, then each one has
    to pay for itself. Returns val accuracy, s and k per example, and the difficulty."""
    from scalelab.jobs.data.synthetic.classification import make_classification

    torch.manual_seed(seed)
    kw = {"seq_len": 16, "n_classes": 2, "vocab_size": 64, "easy_repeats": 8}
    train = make_classification(8192, seed=seed, **kw)
    val = make_classification(1024, seed=seed + 100, **kw)
    cfg = ModelConfig(
        size="nano",
        n_layer=1,
        n_head=8,
        vocab_size=64,
        block_size=16,
        task="classify",
        n_classes=2,
        budget={"cost_weight": 0.15, "cost_warmup": 1.0},
    )
    model = build(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    x, y = torch.from_numpy(train.tokens), torch.from_numpy(train.labels)
    for step in range(steps):
        i = torch.randint(0, len(y), (64,))
        loss = model(x[i], y[i], progress=step / steps).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        logits = model(torch.from_numpy(val.tokens)).logits
    attn = model.blocks[0].attn
    return {
        "correct": (logits.argmax(-1) == torch.from_numpy(val.labels)).float(),
        "s": attn.last_s.squeeze(-1),
        "k": attn.last_k.squeeze(-1).float(),
        "hard": torch.from_numpy(val.difficulty).bool(),
    }


@pytest.mark.slow
def test_hard_examples_get_a_larger_budget_and_are_still_classified():
    """The paper's qualitative claim on seeds 0-3 (~30 s on one core). Measured on seeds
    0-12 of this setting: the hard pairs were learned in all 13 (hard accuracy >= 0.96);
    s(hard) - s(easy) was +0.12..+0.57 in 9 seeds, and within 0.01 of 0 in the other 4,
    where the pair relation ended up in one head and both difficulties ran k = 1 (then a
    hard example needs no more heads than an easy one). Never negative. The thresholds
    leave room for other numerics (another CPU changes the trajectories): they fail only
    if every seed ends in such a tie (~1% at the rate above)."""
    gaps, k_gaps = [], []
    for seed in range(4):
        r = train_on_mixed_difficulty(seed)
        hard = r["hard"]
        assert r["correct"][~hard].mean() > 0.95 and r["correct"][hard].mean() > 0.9, seed
        gaps.append((r["s"][hard].mean() - r["s"][~hard].mean()).item())
        k_gaps.append((r["k"][hard].mean() - r["k"][~hard].mean()).item())
    assert min(gaps) > -0.01, gaps  # hard examples never get a smaller budget
    assert sum(gaps) / len(gaps) > 0.02, gaps  # and a larger one on average
    assert sum(k_gaps) / len(k_gaps) > 0.2, k_gaps  # inference runs more heads for them
