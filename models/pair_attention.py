"""Causal attention for a set of (query, position) pairs: the queries BudgetFormer keeps
after choosing each token's heads (models/budget_layers.py), laid out per row and attended
with one masked SDPA per position chunk."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def causal_pair_attention(
    q: Tensor, t: Tensor, group: Tensor, k: Tensor, v: Tensor, scale: float | None = None
) -> Tensor:
    """Causal attention for P query pairs: pair i is the query q[i] (P, d_head) at position
    t[i] of row group[i] = u * B + b of k, v (U, B, T, d_head, any strides); pairs sorted
    by (group, t). `scale`: of q.k, None for 1 / sqrt(d_head).

    Positions are cut into chunks of >= 128 (at most 4); the queries of chunk c attend only
    keys [0, end of c). Like is_causal for full attention, this skips keys after a query:
    the key work is ~(C + 1) / 2C of T per query for C chunks instead of all T."""
    T = k.size(2)
    n_chunks = max(1, min(4, T // 128))
    if n_chunks == 1:
        return _padded_pair_attention(q, t, group, k, v, T, scale)
    size = -(-T // n_chunks)
    chunk = t // size
    y = q.new_empty(q.shape)
    for c in range(n_chunks):
        sel = (chunk == c).nonzero().squeeze(1)
        if sel.numel():
            end = min(T, (c + 1) * size)
            part = _padded_pair_attention(q[sel], t[sel], group[sel], k, v, end, scale)
            y.index_copy_(0, sel, part)
    return y


def _padded_pair_attention(
    q: Tensor, t: Tensor, group: Tensor, k: Tensor, v: Tensor, end: int, scale: float | None
) -> Tensor:
    """The pairs' queries laid out per group (padded to the longest list), one SDPA over
    keys [0, end) with a causal mask, and each pair's row read back."""
    U, B, T, dh = k.shape
    counts = torch.bincount(group, minlength=U * B)
    rank = torch.arange(group.numel(), device=q.device) - (counts.cumsum(0) - counts)[group]
    n_q = int(counts.max())
    slot = group * n_q + rank  # row of each pair in the padded (U B n_q) layout
    q_pad = q.new_zeros(U * B * n_q, dh).index_copy_(0, slot, q)
    pos = torch.full((U * B * n_q,), T, device=q.device).index_copy_(0, slot, t)
    mask = torch.arange(end, device=q.device) <= pos.view(U, B, n_q, 1)  # padding: all
    out = F.scaled_dot_product_attention(
        q_pad.view(U, B, n_q, dh), k[:, :, :end], v[:, :, :end], attn_mask=mask, scale=scale
    )
    return out.reshape(U * B * n_q, dh).index_select(0, slot)
