"""BudgetFormer: adaptive head budgeting for multi-head attention.

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
    L_budget  = lambda_b * mean(relu(s_min - s) + relu(s - s_max)) + lambda_c * mean(s)
    L_entropy = lambda_e(t) * mean(H(p)) / log H      lambda_e: < 0 early (spread), > 0 late

Encoder (cfg.causal False): one decision per example from the whole-sequence mean over real
tokens (pad_mask). Decoder: one decision per query token t from the prefix mean x_bar_t =
mean(x_1..x_t), so nothing at t depends on tokens after t. Inference then computes K/V of a
head at every position only if some token of the sequence selected it, and Q, the attention
row and the output mixing only for the (token, head) pairs that selected it.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from models.attention import MultiHeadAttention, merge_heads
from models.config import BudgetConfig, ModelConfig
from models.context import ForwardContext


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
    """Multi-head attention that runs, per input, only the k most relevant heads
    (HEAD_SELECTION['budget'])."""

    def __init__(self, cfg: ModelConfig, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        assert cfg.budget is not None
        self.budget: BudgetConfig = cfg.budget
        self.layer_idx = layer_idx
        d, hidden = cfg.d_model, cfg.budget.budget_hidden
        # f_theta: d -> hidden -> 1 (sigmoid applied in forward); g_phi: d -> H
        self.budget_net = nn.Sequential(nn.Linear(d, hidden), nn.GELU(), nn.Linear(hidden, 1))
        self.relevance_net = nn.Linear(d, self.n_head)
        self.last_s: Tensor | None = None  # budget per decision, (B, 1) or (B, T)
        self.last_k: Tensor | None = None  # heads run per decision, (B, 1) or (B, T)
        self.last_union: Tensor | None = None  # heads whose K/V were computed, (B,)

    def post_init(self) -> None:
        # s starts in the middle of the target interval, whatever the input.
        s0 = 0.5 * (self.budget.s_min + self.budget.s_max)
        nn.init.constant_(self.budget_net[2].bias, math.log(s0 / (1 - s0)))

    # --- decisions -------------------------------------------------------------------
    def pool(self, x: Tensor, ctx: ForwardContext) -> Tensor:
        """x_bar: (B, T, d) prefix means if causal, else (B, 1, d) masked mean."""
        if self.causal:
            count = torch.arange(1, x.size(1) + 1, device=x.device, dtype=x.dtype)
            return x.cumsum(dim=1) / count[:, None]
        if ctx.pad_mask is None:
            return x.mean(dim=1, keepdim=True)
        w = ctx.pad_mask.to(x.dtype).unsqueeze(-1)
        return (x * w).sum(dim=1, keepdim=True) / w.sum(dim=1, keepdim=True).clamp_min(1.0)

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
        return self.resid_dropout(self.out_proj(merge_heads(y)))

    def sparse_forward(self, x: Tensor, active: Tensor, ctx: ForwardContext) -> Tensor:
        """Only the selected heads computed (inference path). active: (B, T', H) bool."""
        if self.causal:
            return self.resid_dropout(self._per_token_heads(x, active))
        return self.resid_dropout(self._per_example_heads(x, active[:, 0], ctx))

    def _per_example_heads(self, x: Tensor, active: Tensor, ctx: ForwardContext) -> Tensor:
        """Encoder: examples are grouped by their selected head set; per group one GEMM with
        the gathered Q/K/V rows of W_qkv, SDPA over those k heads, and dense W_O restricted
        to their k * d_head columns (any other mixer, e.g. Hadamard, gets the heads
        scattered into a zero (B, T, H * d_head) buffer)."""
        B, T, d = x.shape
        H, dh = self.n_head, self.d_head
        w_qkv = self.c_attn.weight.view(3, H, dh, d)
        b_qkv = self.c_attn.bias.view(3, H, dh) if self.c_attn.bias is not None else None
        dense_out = isinstance(self.out_proj, nn.Linear)
        out = x.new_empty(B, T, d) if dense_out else x.new_zeros(B, T, H, dh)
        head_sets, group = torch.unique(active, dim=0, return_inverse=True)
        for g, head_set in enumerate(head_sets):
            heads = head_set.nonzero().squeeze(1)
            k = heads.numel()
            rows = (group == g).nonzero().squeeze(1)
            everyone = rows.numel() == B
            xs = x if everyone else x.index_select(0, rows)
            w = w_qkv[:, heads].reshape(3 * k * dh, d)
            b = b_qkv[:, heads].reshape(-1) if b_qkv is not None else None
            q, key, v = F.linear(xs, w, b).view(-1, T, 3, k, dh).permute(2, 0, 3, 1, 4)
            mask = None
            if ctx.pad_mask is not None:
                mask = ctx.pad_mask.index_select(0, rows)[:, None, None, :]
            y = F.scaled_dot_product_attention(q, key, v, attn_mask=mask).transpose(1, 2)
            if dense_out:
                cols = (heads[:, None] * dh + torch.arange(dh, device=x.device)).flatten()
                y = F.linear(y.reshape(-1, T, k * dh), self.out_proj.weight[:, cols])
            if everyone and dense_out:
                out = y
            elif dense_out:
                out[rows] = y
            else:
                out[rows.unsqueeze(1), :, heads] = y.transpose(1, 2)  # -> (n, k, T, dh) slots
        if not dense_out:
            return self.out_proj(out.view(B, T, d))
        return out + self.out_proj.bias if self.out_proj.bias is not None else out

    def _per_token_heads(self, x: Tensor, active: Tensor) -> Tensor:
        """Decoder, per head h: K/V at every position for the sequences where some token
        selected h, Q and the attention row only for the tokens that selected it; dense
        W_O uses only head h's d_head columns (accumulated into the output), any other
        mixer gets the selected heads scattered into a zero (B, T, H * d_head) buffer."""
        B, T, d = x.shape
        H, dh = self.n_head, self.d_head
        w_qkv = self.c_attn.weight.view(3, H, dh, d)
        b_qkv = self.c_attn.bias.view(3, H, dh) if self.c_attn.bias is not None else None
        dense_out = isinstance(self.out_proj, nn.Linear)
        out = x.new_zeros(B, T, d) if dense_out else None
        heads = None if dense_out else x.new_zeros(B, T, H, dh)
        for h in range(H):
            sel = active[:, :, h]  # (B, T)
            rows = sel.any(dim=1).nonzero().squeeze(1)
            if rows.numel() == 0:
                continue
            xs = x if rows.numel() == B else x.index_select(0, rows)
            w, b = w_qkv[:, h], (b_qkv[:, h] if b_qkv is not None else None)
            kv = F.linear(
                xs, w[1:].reshape(2 * dh, d), b[1:].reshape(-1) if b is not None else None
            )
            k, v = kv.unsqueeze(1).split(dh, dim=-1)  # (n, 1, T, dh) each
            y, bt = self._causal_rows(xs, sel.index_select(0, rows), rows, k, v, w[0], b)
            if dense_out:
                contrib = F.linear(y, self.out_proj.weight[:, h * dh : (h + 1) * dh])
                out.index_put_(bt, contrib, accumulate=True)
            else:
                heads[bt[0], bt[1], h] = y
        if not dense_out:
            return self.out_proj(heads.view(B, T, d))
        return out + self.out_proj.bias if self.out_proj.bias is not None else out

    def _causal_rows(
        self,
        xs: Tensor,
        sel: Tensor,
        rows: Tensor,
        k: Tensor,
        v: Tensor,
        w_q: Tensor,
        b: Tensor | None,
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """Attention of one head for its selected query tokens only (queries gathered and
        padded to the longest selection in the batch; padded rows are dropped)."""
        n, T = sel.shape
        counts = sel.sum(dim=1)
        n_q = int(counts.max())
        pos = (~sel).to(torch.int8).argsort(dim=1, stable=True)[:, :n_q]  # selected first
        valid = torch.arange(n_q, device=xs.device) < counts[:, None]
        xq = xs.gather(1, pos.unsqueeze(-1).expand(n, n_q, xs.size(-1)))
        q = F.linear(xq, w_q, b[0] if b is not None else None).unsqueeze(1)
        causal = torch.arange(T, device=xs.device) <= pos.unsqueeze(-1)  # (n, n_q, T)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=causal.unsqueeze(1)).squeeze(1)
        batch_idx = rows.unsqueeze(1).expand(n, n_q)[valid]
        return y[valid], (batch_idx, pos[valid])

    def forward(self, x: Tensor, ctx: ForwardContext) -> Tensor:
        s, r = self.decide(self.pool(x, ctx))
        tau = self.tau(ctx.progress)
        if self.training:
            # Exploration noise only serves learning: a no-grad pass is deterministic.
            noise = self.budget.gumbel_noise and torch.is_grad_enabled()
            mask = self.soft_mask(s, r, tau, noise=noise)
            out = self.masked_forward(x, mask, ctx)
            heads_active = mask.mean()
            self._add_losses(s, r, tau, ctx)
        else:
            k, active = self.hard_mask(s, r)
            out = self.sparse_forward(x, active, ctx)
            self.last_s, self.last_k, self.last_union = s, k, active.any(dim=1).sum(dim=-1)
            heads_active = k.float().mean() / self.n_head
        ctx.add_metric("budget/s_mean", s.mean())
        ctx.add_metric("budget/heads_active", heads_active)
        ctx.add_metric("budget/entropy", self._entropy(r, tau).mean())
        ctx.add_metric("budget/tau", torch.tensor(tau))
        return out

    # --- losses ----------------------------------------------------------------------
    def _entropy(self, r: Tensor, tau: float) -> Tensor:
        """Normalised entropy H(p) / log H of p = softmax(r / tau), in [0, 1]."""
        logp = F.log_softmax(r / tau, dim=-1)
        return -(logp.exp() * logp).sum(dim=-1) / math.log(self.n_head)

    def _add_losses(self, s: Tensor, r: Tensor, tau: float, ctx: ForwardContext) -> None:
        b = self.budget
        outside = F.relu(b.s_min - s) + F.relu(s - b.s_max)
        ctx.add_loss(
            "budget/budget", b.budget_loss_weight * outside.mean() + b.cost_weight * s.mean()
        )
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
