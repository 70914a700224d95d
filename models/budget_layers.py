"""BudgetFormer's attention module: adaptive head budgeting for multi-head attention (the
mechanism, its config and its counts: models/budget.py).

Symbols as in the paper (equations and defaults: docs/reproducing/budgetformer.md):
    x_bar = Pool(x)                              mean of the layer input (prefix mean if causal)
    s     = sigmoid(f_theta(x_bar)) in (0, 1)    budget: the fraction of heads to run
    r     = g_phi(x_bar) in R^H                  relevance logits, one per head
    p     = softmax(r / tau)                     relevance distribution (entropy term)

Inference (hard): k = max(1, floor(s * H)); the k heads with the largest r run, the others
are never computed (their Q/K/V rows and W_O columns are not touched).

Training (soft top-k, hardness = tau): with Gumbel exploration noise G (r~ = r + G),
    rho_h = sum_{j != h} sigmoid((r~_j - r~_h) / tau)      soft rank of head h (0 = best)
    theta = max(s * H - 1, 1/2)                           soft budget threshold
    m_h   = sigmoid((theta - rho_h) / tau)                mask on head h's output
As tau -> 0 without noise, rho_h -> #{j : r_j > r_h} and m_h -> [rank_h < k]: the hard
inference mask (tests/models/test_budget.py proves it). Head outputs are scaled by m_h
before the output mixing, so a hard mask gives exactly the inference computation.

Loss per layer (summed over layers by ForwardContext.add_loss):
    L_budget  = lambda_b * mean(relu(s_min - s) + relu(s - s_max)) + lambda_c(t) * mean(s)
    L_entropy = lambda_e(t) * mean(H(p)) / log H      lambda_e: < 0 early (spread), > 0 late
    lambda_c(t) = lambda_c * min(1, t / cost_warmup)  (constant if cost_warmup = 0)

Encoder (cfg.causal False): one decision per example from the whole-sequence mean over real
tokens (pad_mask). Decoder: one decision per query token t from the prefix mean x_bar_t =
mean(x_1..x_t), so nothing at t depends on tokens after t. Inference then computes K/V of a
head at every position only if some token of the batch selected it, and Q, the attention
row and the output mixing only for the (token, head) pairs that selected it.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from scalelab.models.budget_flops import LayerFlopTerms
from scalelab.models.context import ForwardContext, masked_mean
from scalelab.models.dense_layers import MultiHeadAttention, merge_heads
from scalelab.models.pair_attention import causal_pair_attention
from scalelab.models.parametrization import set_role

if TYPE_CHECKING:
    from scalelab.models.budget import BudgetConfig
    from scalelab.models.config import ModelConfig


def schedule(name: str, start: float, end: float, progress: float) -> float:
    """Value of a schedule at `progress` in [0, 1]: linear, cosine, exponential or constant."""
    t = min(max(progress, 0.0), 1.0)
    if name == "linear":
        return start + (end - start) * t
    if name == "cosine":
        return end + (start - end) * 0.5 * (1.0 + math.cos(math.pi * t))
    if name == "exponential":  # geometric interpolation (both ends > 0)
        return start * (end / start) ** t
    if name == "constant":
        return start
    raise ValueError(f"unknown schedule {name!r}")


class BudgetAttention(MultiHeadAttention):
    """Multi-head attention that runs, per input, only the k most relevant heads."""

    def __init__(
        self, cfg: ModelConfig, layer_idx: int, out_proj: nn.Module, budget: BudgetConfig
    ) -> None:
        super().__init__(cfg, layer_idx, out_proj)
        self.budget = budget
        self.cfg = cfg
        self.layer_idx = layer_idx
        self.n_layer = cfg.n_layer
        self.flop_terms = LayerFlopTerms.of(cfg)
        d, hidden = cfg.d_model, budget.budget_hidden
        # f_theta: d -> hidden -> 1 (sigmoid applied in forward); g_phi: d -> H. Width roles
        # (models/parametrization.py): d -> fixed layers are outputs, hidden -> 1 is fixed.
        self.budget_net = nn.Sequential(
            set_role(nn.Linear(d, hidden), "output"),
            nn.GELU(),
            set_role(nn.Linear(hidden, 1), "fixed"),
        )
        self.relevance_net = set_role(nn.Linear(d, self.n_head), "output")
        self.last_s: Tensor | None = None  # budget per decision, (B, 1) or (B, T)
        self.last_k: Tensor | None = None  # heads run per decision, (B, 1) or (B, T)
        self.last_union: Tensor | None = None  # heads whose K/V were computed (decoder), (B,)

    def post_init(self) -> None:
        # s starts in the middle of the target interval, whatever the input: f_theta's last
        # layer starts at zero (its weights still get gradient through the hidden layer,
        # which keeps the parametrisation's init).
        s0 = 0.5 * (self.budget.s_min + self.budget.s_max)
        nn.init.zeros_(self.budget_net[2].weight)
        nn.init.constant_(self.budget_net[2].bias, math.log(s0 / (1 - s0)))

    # --- decisions -------------------------------------------------------------------
    def pool(self, x: Tensor, ctx: ForwardContext) -> Tensor:
        """x_bar: (B, T, d) prefix means if causal, else (B, 1, d) masked mean."""
        if self.causal:
            count = torch.arange(1, x.size(1) + 1, device=x.device, dtype=x.dtype)
            return x.cumsum(dim=1) / count[:, None]
        mask = None if ctx.pad_mask is None else ctx.pad_mask.unsqueeze(-1)
        return masked_mean(x, mask, dim=1, keepdim=True)

    def decide(self, x_bar: Tensor) -> tuple[Tensor, Tensor]:
        """s (B, T'), r (B, T', H) from the pooled input."""
        s = torch.sigmoid(self.budget_net(x_bar)).squeeze(-1)
        return s, self.relevance_net(x_bar)

    def tau(self, progress: float) -> float:
        b = self.budget
        return schedule(b.tau_schedule, b.tau_start, b.tau_end, progress)

    def soft_mask(self, s: Tensor, r: Tensor, tau: float, noise: bool) -> Tensor:
        """m in (0, 1)^H per decision: the soft top-k relaxation (module docstring)."""
        if noise:
            r = r - torch.log(-torch.log(torch.rand_like(r).clamp(1e-9, 1 - 1e-9)))  # + Gumbel
        pairwise = torch.sigmoid((r.unsqueeze(-2) - r.unsqueeze(-1)) / tau)  # [h, j]
        rho = pairwise.sum(dim=-1) - 0.5  # drop the j = h term sigmoid(0)
        theta = (s * self.n_head - 1.0).clamp_min(0.5)
        return torch.sigmoid((theta.unsqueeze(-1) - rho) / tau)

    def hard_mask(self, s: Tensor, r: Tensor) -> tuple[Tensor, Tensor]:
        """k = max(1, floor(s H)) and the boolean mask of the top-k heads by relevance."""
        k = torch.floor(s * self.n_head).clamp(1, self.n_head).long()
        rank = r.argsort(dim=-1, descending=True).argsort(dim=-1)  # 0 = most relevant
        return k, rank < k.unsqueeze(-1)

    # --- computation -----------------------------------------------------------------
    def masked_forward(self, x: Tensor, mask: Tensor, ctx: ForwardContext) -> Tensor:
        """All heads computed, head h's output scaled by mask[..., h] (training path)."""
        y = self.attend(*self.split_heads(x), ctx)  # (B, H, T, dh)
        y = y * mask.transpose(1, 2).unsqueeze(-1).to(y.dtype)  # (B, T', H) -> (B, H, T', 1)
        return self.out_proj(merge_heads(y))

    def sparse_forward(self, x: Tensor, active: Tensor, ctx: ForwardContext) -> Tensor:
        """Only the selected heads computed (inference path). active: (B, T', H) bool."""
        if self.causal:
            return self._per_token_heads(x, active)
        return self._per_example_heads(x, active[:, 0], ctx)

    def _head_weights(self) -> tuple[Tensor, Tensor | None]:
        """W_qkv as (3, H, d_head, d) and its bias as (3, H, d_head) (views, no copy)."""
        H, dh, d = self.n_head, self.d_head, self.c_attn.in_features
        b = self.c_attn.bias
        return self.c_attn.weight.view(3, H, dh, d), (b.view(3, H, dh) if b is not None else None)

    def _per_example_heads(self, x: Tensor, active: Tensor, ctx: ForwardContext) -> Tensor:
        """Encoder. One head set for the whole batch: `_same_heads`. Otherwise batched per
        head: for each head h, the examples that selected it are gathered and run through
        h's Q/K/V rows of W_qkv, SDPA, and h's d_head columns of a dense W_O (accumulated
        into those examples' output rows). Work is sum_h n_h = sum_b k_b example-heads
        whatever the head sets, with no padding. Any other mixer (e.g. Hadamard) gets the
        heads written into a zero (B, T, H * d_head) buffer."""
        B, T, d = x.shape
        dh = self.d_head
        w_qkv, b_qkv = self._head_weights()
        dense_out = isinstance(self.out_proj, nn.Linear)
        out = x.new_zeros(B, T, d) if dense_out else x.new_zeros(B, T, self.n_head * dh)
        if bool((active == active[:1]).all()):
            mask = None if ctx.pad_mask is None else ctx.pad_mask[:, None, None, :]
            return self._same_heads(x, active[0].nonzero().squeeze(1), mask)
        counts = active.sum(dim=0).tolist()  # one host sync for the whole layer
        for h, n_h in enumerate(counts):
            if n_h == 0:
                continue
            rows = None if n_h == B else active[:, h].nonzero().squeeze(1)
            xs = x if rows is None else x.index_select(0, rows)
            # Q, K and V of head h in one GEMM (threads share one GEMM better than three)
            bias = b_qkv[:, h].reshape(-1) if b_qkv is not None else None
            qkv = F.linear(xs, w_qkv[:, h].reshape(3 * dh, d), bias)
            q, k, v = qkv.view(n_h, T, 3, 1, dh).permute(2, 0, 3, 1, 4)
            mask = None
            if ctx.pad_mask is not None:
                pm = ctx.pad_mask if rows is None else ctx.pad_mask.index_select(0, rows)
                mask = pm[:, None, None, :]
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scale)
            y = y.reshape(n_h * T, dh)
            cols = slice(h * dh, (h + 1) * dh)
            if dense_out and rows is None:
                acc, w_o = out.view(B * T, d), self.out_proj.weight[:, cols].t()
                if torch.is_grad_enabled():
                    out = torch.addmm(acc, y, w_o).view(B, T, d)
                else:  # fused in-place += (out= form: FlopCounterMode counts it, addmm_ not)
                    torch.addmm(acc, y, w_o, out=acc)
            elif dense_out:
                y = F.linear(y, self.out_proj.weight[:, cols]).view(n_h, T, d)
                out.index_add_(0, rows, y)
            elif rows is None:
                out[:, :, cols] = y.view(B, T, dh)
            else:
                out[rows, :, cols] = y.view(n_h, T, dh)
        if not dense_out:
            return self.out_proj(out)
        return out + self.out_proj.bias if self.out_proj.bias is not None else out

    def _same_heads(self, x: Tensor, heads: Tensor, mask: Tensor | None = None) -> Tensor:
        """Every decision of the batch chose the same heads: one GEMM with their rows of
        W_qkv, SDPA over those heads (causal in the decoder), W_O restricted to their
        columns (all heads: the weights as they are, nothing gathered)."""
        B, T, d = x.shape
        dh, k = self.d_head, heads.numel()
        every = k == self.n_head
        if every:
            qkv = self.c_attn(x)
        else:
            w_qkv, b_qkv = self._head_weights()
            bias = b_qkv.index_select(1, heads).reshape(-1) if b_qkv is not None else None
            qkv = F.linear(x, w_qkv.index_select(1, heads).reshape(3 * k * dh, d), bias)
        q, key, v = qkv.view(B, T, 3, k, dh).permute(2, 0, 3, 1, 4)
        causal = self.causal and mask is None
        y = F.scaled_dot_product_attention(
            q, key, v, attn_mask=mask, is_causal=causal, scale=self.scale
        )
        y = y.transpose(1, 2)
        y = y.reshape(B, T, k * dh)
        if every:
            return self.out_proj(y)
        if isinstance(self.out_proj, nn.Linear):
            w_o = self.out_proj.weight.view(d, self.n_head, dh).index_select(1, heads)
            return F.linear(y, w_o.reshape(d, k * dh), self.out_proj.bias)
        buf = x.new_zeros(B, T, self.n_head, dh)
        buf[:, :, heads] = y.view(B, T, k, dh)
        return self.out_proj(buf.view(B, T, d))

    def _per_token_heads(self, x: Tensor, active: Tensor) -> Tensor:
        """Decoder. K/V: one GEMM for the heads that some token of the batch selected (the
        union U). Q: for each head, one GEMM over exactly the tokens that selected it (no
        padding). Attention: `causal_pair_attention`, chunked by position so that a query
        does not pay for the keys after it. Dense W_O: per head, its d_head columns applied
        to its pairs and index_add-ed into their output rows; any other mixer gets the pairs
        written into a zero (B, T, H * d_head) buffer."""
        B, T, d = x.shape
        H, dh = self.n_head, self.d_head
        flat_active = active.flatten(0, 1)
        if bool((flat_active == flat_active[:1]).all()):
            return self._same_heads(x, flat_active[0].nonzero().squeeze(1))
        w_qkv, b_qkv = self._head_weights()
        union = flat_active.any(dim=0)  # (H,)
        heads = union.nonzero().squeeze(1)
        U = heads.numel()
        every = U == H
        w_u = w_qkv if every else w_qkv.index_select(1, heads)  # (3, U, dh, d)
        b_u = None if b_qkv is None else (b_qkv if every else b_qkv.index_select(1, heads))
        kv_bias = b_u[1:].reshape(-1) if b_u is not None else None
        kv = F.linear(x, w_u[1:].reshape(2 * U * dh, d), kv_bias)  # (B, T, 2 U dh)
        k, v = kv.view(B, T, 2, U, dh).permute(2, 3, 0, 1, 4)  # (U, B, T, dh) views

        sel = active.permute(2, 0, 1) if every else active.permute(2, 0, 1)[heads]  # (U, B, T)
        per_head = sel.sum(dim=(1, 2)).tolist()  # pairs per head
        pair = sel.reshape(U, B * T).nonzero()  # (P, 2): (u, b T + t), sorted by (u, b, t)
        rows = pair[:, 1]
        x_flat = x.reshape(B * T, d)
        q = torch.cat(
            [
                F.linear(x_flat.index_select(0, r), w_u[0, u], None if b_u is None else b_u[0, u])
                for u, r in enumerate(rows.split(per_head))
            ]
        )  # (P, dh)
        group = pair[:, 0] * B + rows // T  # (head, sequence) of each pair
        y = causal_pair_attention(q, rows % T, group, k, v, self.scale)  # (P, dh)
        if isinstance(self.out_proj, nn.Linear):
            w_o = self.out_proj.weight.view(d, H, dh)
            bias = self.out_proj.bias
            out = x.new_zeros(B * T, d) if bias is None else bias.expand(B * T, d).clone()
            for h, r, y_h in zip(
                heads.tolist(), rows.split(per_head), y.split(per_head), strict=True
            ):
                out.index_add_(0, r, F.linear(y_h, w_o[:, h]))
            return out.view(B, T, d)
        buf = x.new_zeros(B * T, H, dh)
        buf[rows, heads[pair[:, 0]]] = y
        return self.out_proj(buf.view(B, T, d))

    def forward(self, x: Tensor, ctx: ForwardContext) -> Tensor:
        s, r = self.decide(self.pool(x, ctx))
        tau = self.tau(ctx.progress)
        k, active = self.hard_mask(s.detach(), r.detach())
        if self.training:
            # Exploration noise only serves learning: a no-grad pass is deterministic.
            noise = self.budget.gumbel_noise and torch.is_grad_enabled()
            mask = self.soft_mask(s, r, tau, noise=noise)
            out = self.masked_forward(x, mask, ctx)
            heads_active = mask.mean()
            self._add_losses(s, r, tau, ctx)
        else:
            out = self.sparse_forward(x, active, ctx)
            heads_active = k.float().mean() / self.n_head
        union = active.flatten(0, 1).any(dim=0).sum().expand(x.size(0))  # decoder K/V heads
        if not self.training:
            self.last_s, self.last_k, self.last_union = s, k, union
        ctx.add_metric("budget/s_mean", s.mean())
        ctx.add_metric("budget/heads_active", heads_active)
        ctx.add_metric("budget/entropy", self._entropy(r, tau).mean())
        ctx.add_metric("budget/tau", torch.tensor(tau))
        self._add_flops_metrics(k, union, x.size(1), ctx)
        return out

    def _add_flops_metrics(self, k: Tensor, union: Tensor, T: int, ctx: ForwardContext) -> None:
        """Attention FLOPs that the hard (inference) path runs for these decisions: in eval
        what was executed, in training what inference would execute (training computes all
        heads under the soft mask). attn_flops: per token, summed over layers (each layer
        adds n_layer x its own; metrics are averaged over layers); attn_flops_ratio: over
        the same layer with every head (which runs no budget or relevance net)."""
        B, terms = k.size(0), self.flop_terms
        executed = terms.flops(k.float(), T, union.float())
        every = torch.full_like(k, self.n_head, dtype=torch.float32)
        full = terms.flops(every, T, every.new_full((B,), self.n_head))
        full = full - (B * T if self.causal else B) * terms.net
        ctx.add_metric("budget/attn_flops", executed * self.n_layer / (B * T))
        ctx.add_metric("budget/attn_flops_ratio", executed / full)

    # --- losses ----------------------------------------------------------------------
    def _entropy(self, r: Tensor, tau: float) -> Tensor:
        """Normalised entropy H(p) / log H of p = softmax(r / tau), in [0, 1]."""
        logp = F.log_softmax(r / tau, dim=-1)
        return -(logp.exp() * logp).sum(dim=-1) / math.log(self.n_head)

    def _add_losses(self, s: Tensor, r: Tensor, tau: float, ctx: ForwardContext) -> None:
        b = self.budget
        outside = F.relu(b.s_min - s) + F.relu(s - b.s_max)
        cost = (
            b.cost_weight * min(1.0, ctx.progress / b.cost_warmup)
            if b.cost_warmup
            else b.cost_weight
        )
        ctx.add_loss("budget/budget", b.budget_loss_weight * outside.mean() + cost * s.mean())
        weight = schedule(
            b.entropy_schedule, b.entropy_weight_start, b.entropy_weight_end, ctx.progress
        )
        ctx.add_loss("budget/entropy", weight * self._entropy(r, tau).mean())


def budget_decisions(model: nn.Module) -> list[tuple[Tensor, Tensor]]:
    """(k, union) of every BudgetAttention layer after an eval forward: k is (B, 1) for the
    encoder or (B, T) for the decoder; union (B,) counts the heads whose K/V were computed."""
    return [
        (m.last_k, m.last_union)
        for m in model.modules()
        if isinstance(m, BudgetAttention) and m.last_k is not None
    ]
