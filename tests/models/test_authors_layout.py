"""scalelab's model with a paper's layout options computes what the authors' model computes.

`AuthorsTSA` below is written from the TSA paper's equations and the layout the authors' code
uses (docs/reproducing/tsa.md, "The authors' layout"), in plain torch, not from scalelab's
modules: a pre-norm decoder with learned positions and tied embeddings; attention without
biases, dropout on its probabilities only; FFN = Linear -> GELU -> Dropout -> Linear ->
Dropout with biases; after block l a router p_l = sigmoid(W2 ReLU(W1 x + b1) + b2) gates
block l+1's two residual updates by (1 - p_l); L = CE + lambda * mean(1 - p).
`benchmarks/side_by_side.py` trains it as its fallback reference.
"""

from __future__ import annotations

import functools
import math

import pytest
import torch
import torch.nn.functional as F
from pydantic import ValidationError
from torch import Tensor, nn

from scalelab.jobs.config import JobConfig
from scalelab.models.build import build
from scalelab.models.config import ModelConfig
from scalelab.models.flops import count_params
from scalelab.orchestrator.plan.memory import parameter_sizes

# The TSA authors' choices as scalelab's options (sweeps/tsa*.yaml set the same).
AUTHORS_TSA = dict(
    dropout_sites=["embedding", "attention_probs", "ffn_hidden", "ffn_out"],
    qkv_bias=False,
    attn_out_bias=False,
    bias_init="uniform",
    init_distribution="uniform",
)
SHAPE = dict(size="nano", n_layer=3, d_model=32, n_head=2, vocab_size=64, block_size=16)
LAMBDA = 0.05


class AuthorsBlock(nn.Module):
    def __init__(self, d: int, heads: int, p: float) -> None:
        super().__init__()
        self.heads, self.p = heads, p
        self.norm_a, self.norm_f = nn.LayerNorm(d), nn.LayerNorm(d)
        self.w_qkv = nn.Linear(d, 3 * d, bias=False)
        self.w_o = nn.Linear(d, d, bias=False)
        self.w_1, self.w_2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def attention(self, x: Tensor) -> Tensor:
        """softmax(q k^T / sqrt(d_head)) v per head, causal, dropout on the probabilities."""
        b, t, d = x.shape
        q, k, v = (
            z.reshape(b, t, self.heads, d // self.heads).transpose(1, 2)
            for z in self.w_qkv(x).chunk(3, dim=-1)
        )
        p = self.p if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=p)
        return self.w_o(y.transpose(1, 2).reshape(b, t, d))

    def ffn(self, x: Tensor) -> Tensor:
        h = F.dropout(F.gelu(self.w_1(x)), self.p, self.training)
        return F.dropout(self.w_2(h), self.p, self.training)


class AuthorsTSA(nn.Module):
    def __init__(self, vocab: int, context: int, d: int, layers: int, heads: int, p: float):
        super().__init__()
        self.p = p
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(context, d)
        self.blocks = nn.ModuleList(AuthorsBlock(d, heads, p) for _ in range(layers))
        r = max(16, d // 4)
        self.r_in = nn.ModuleList(nn.Linear(d, r) for _ in range(layers - 1))
        self.r_out = nn.ModuleList(nn.Linear(r, 1) for _ in range(layers - 1))
        self.norm = nn.LayerNorm(d)
        self.init_as_authors(layers)

    def init_as_authors(self, layers: int) -> None:
        """PyTorch's nn.Linear default (uniform weights and biases), except embeddings
        N(0, 0.02), the residual projections (W_O, the FFN's second layer) N(0, 0.02^2 / 2L)
        and the routers' output bias -1 (p starts at sigmoid(-1))."""
        with torch.no_grad():
            for emb in (self.tok, self.pos):
                emb.weight.normal_(0.0, 0.02)
            for block in self.blocks:
                for proj in (block.w_o, block.w_2):
                    proj.weight.normal_(0.0, 0.02 / math.sqrt(2 * layers))
            for out in self.r_out:
                out.bias.fill_(-1.0)

    def forward(self, idx: Tensor, targets: Tensor, lambda_depth: float = LAMBDA) -> Tensor:
        pos = torch.arange(idx.size(1))
        x = F.dropout(self.tok(idx) + self.pos(pos), self.p, self.training)
        first = self.blocks[0]
        x = x + first.attention(first.norm_a(x))
        x = x + first.ffn(first.norm_f(x))
        gates = []
        for i, block in enumerate(self.blocks[1:]):
            g = 1 - torch.sigmoid(self.r_out[i](F.relu(self.r_in[i](x))))  # (B, T, 1)
            gates.append(g.squeeze(-1))
            x = x + g * block.attention(block.norm_a(x))
            x = x + g * block.ffn(block.norm_f(x))
        logits = F.linear(self.norm(x), self.tok.weight)  # tied read-out
        ce = F.cross_entropy(logits.flatten(0, 1), targets.reshape(-1))
        return ce + lambda_depth * torch.stack(gates).mean()


def weight_names(n_layer: int) -> dict[str, str]:
    """The authors' model's parameter names -> scalelab's."""
    names = {"tok.weight": "wte.weight", "pos.weight": "wpe.weight"}
    pairs = (("norm_a", "ln_1"), ("norm_f", "ln_2"), ("w_qkv", "attn.c_attn"),
             ("w_o", "attn.out_proj"), ("w_1", "mlp.c_fc"), ("w_2", "mlp.c_proj"))  # fmt: skip
    for part in ("weight", "bias"):
        names[f"norm.{part}"] = f"ln_f.{part}"
        for i in range(n_layer):
            for mine, theirs in pairs:
                names[f"blocks.{i}.{mine}.{part}"] = f"blocks.{i}.{theirs}.{part}"
        for j in range(n_layer - 1):
            names[f"r_in.{j}.{part}"] = f"depth.routers.{j}.fc.{part}"
            names[f"r_out.{j}.{part}"] = f"depth.routers.{j}.out.{part}"
    return names


def copy_weights(ref: nn.Module, ours: nn.Module, n_layer: int) -> None:
    """scalelab's model takes the authors' model's weights; a parameter the authors' model
    does not have (an attention bias at scalelab's default) is set to zero."""
    theirs = dict(ref.named_parameters())
    by_ours = {ours_name: theirs[name] for name, ours_name in weight_names(n_layer).items()
               if name in theirs}  # fmt: skip
    with torch.no_grad():
        for name, param in ours.named_parameters():
            param.copy_(by_ours[name]) if name in by_ours else param.zero_()


def train(model: nn.Module, loss_of, vocab: int, context: int, steps: int) -> list[float]:
    """`steps` AdamW steps with clipping on seeded batches, the random state set before each
    forward (so two models draw the same dropout masks wherever dropout sits in the same
    places); the training losses."""
    data = torch.Generator().manual_seed(1)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1, foreach=False)
    model.train()
    losses = []
    for step in range(steps):
        start = torch.randint(0, vocab, (4, 1), generator=data)  # learnable: t -> t + 1
        x = (start + torch.arange(context + 1)) % vocab
        torch.manual_seed(1000 + step)
        loss = loss_of(x[:, :-1], x[:, 1:])
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
    return losses


def authors_model() -> AuthorsTSA:
    torch.manual_seed(0)  # PyTorch's default init: the authors' own
    return AuthorsTSA(SHAPE["vocab_size"], SHAPE["block_size"], SHAPE["d_model"],
                      SHAPE["n_layer"], SHAPE["n_head"], p=0.1)  # fmt: skip


@functools.cache
def authors_losses(steps: int) -> tuple[float, ...]:
    ref = authors_model()
    return tuple(train(ref, ref, SHAPE["vocab_size"], SHAPE["block_size"], steps))


def scalelab_losses(cfg: ModelConfig, steps: int) -> list[float]:
    ours = build(cfg)
    copy_weights(authors_model(), ours, cfg.n_layer)
    return train(ours, lambda x, y: ours(x, y).loss, cfg.vocab_size, cfg.block_size, steps)


def largest_gap(cfg: ModelConfig, steps: int) -> float:
    theirs = authors_losses(steps)
    return max(abs(a - b) for a, b in zip(scalelab_losses(cfg, steps), theirs, strict=True))


def _cfg(**changes: object) -> ModelConfig:
    return ModelConfig(**SHAPE, dropout=0.1, tsa={"lambda_depth": LAMBDA, **changes.pop("tsa", {})},
                       **changes)  # fmt: skip


def test_authors_options_train_the_authors_model_step_for_step():
    assert largest_gap(_cfg(**AUTHORS_TSA, tsa={"router_activation": "relu"}), 20) < 1e-5
    losses = authors_losses(20)
    assert losses[-1] < losses[0] - 0.1  # it trains


@pytest.mark.parametrize(
    "default",
    ["today", "dropout_sites", "qkv_bias", "attn_out_bias", "router_activation"],
)
def test_each_option_at_its_default_trains_another_model(default):
    """Every option the authors' layout needs changes the computation: with it at scalelab's
    default (or all of them: 'today'), the losses part within 5 steps."""
    options = dict(AUTHORS_TSA, tsa={"router_activation": "relu"})
    if default == "today":
        options = {}
    elif default == "router_activation":
        options["tsa"] = {}
    else:
        options.pop(default)
    assert largest_gap(_cfg(**options), 5) > 1e-5


def test_uniform_init_has_the_normal_variance_and_pytorch_bounds():
    torch.manual_seed(0)
    cfg = ModelConfig(size="nano", d_model=256, n_head=4, vocab_size=64, **AUTHORS_TSA)
    model = build(cfg)
    fc = model.blocks[0].mlp.c_fc
    bound = 1 / math.sqrt(256)
    assert fc.weight.abs().max() <= bound and fc.weight.abs().max() > 0.99 * bound
    assert abs(fc.weight.std().item() - bound / math.sqrt(3)) < 0.02 * bound
    assert fc.bias.abs().max() <= bound and fc.bias.abs().max() > 0.9 * bound  # not zero
    assert model.blocks[0].attn.c_attn.bias is None and model.blocks[0].attn.out_proj.bias is None
    assert model.wte.weight.abs().max() > 0.02 * math.sqrt(3)  # embeddings stay normal
    default = build(ModelConfig(size="nano", d_model=256, n_head=4, vocab_size=64))
    assert (default.blocks[0].mlp.c_fc.bias == 0).all()
    assert default.blocks[0].mlp.c_fc.weight.abs().max() > 1.5 * bound  # normal: unbounded


@pytest.mark.parametrize(
    "options",
    [AUTHORS_TSA, {"bias": False, "ffn_bias": True}, {"qkv_bias": False, "ffn_bias": False}],
)
def test_counts_follow_the_bias_options(options):
    cfg = ModelConfig(size="nano", n_layer=2, vocab_size=64, tsa={}, **options)
    model = build(cfg)
    assert count_params(cfg) == model.num_params()
    assert sorted(parameter_sizes(cfg)) == sorted(p.numel() for p in model.parameters())


def test_defaults_keep_ids_and_sites_are_canonical():
    base = {"model": {"size": "nano"}, "train": {"tokens": 1000}}
    spelled = {"dropout_sites": ["ffn_hidden", "embedding", "attention_probs"],
               "qkv_bias": None, "bias_init": "zero", "init_distribution": "normal",
               "init_std": "fan_in"}  # fmt: skip
    plain = JobConfig.model_validate(base)
    same = JobConfig.model_validate({**base, "model": {"size": "nano", **spelled}})
    assert same.trial_id == plain.trial_id
    tsa = JobConfig.model_validate({**base, "model": {"size": "nano", "tsa": {}}})
    gelu = {"size": "nano", "tsa": {"router_activation": "gelu"}}
    assert JobConfig.model_validate({**base, "model": gelu}).trial_id == tsa.trial_id
    authors = JobConfig.model_validate({**base, "model": {"size": "nano", **AUTHORS_TSA}})
    assert authors.trial_id != plain.trial_id
    assert authors.model.dropout_sites == (
        "embedding", "attention_probs", "ffn_hidden", "ffn_out")  # fmt: skip
    with pytest.raises(ValidationError, match="dropout_sites"):
        ModelConfig(size="nano", dropout_sites=["ffn"])
