"""Cached inference for the LM: prefill and incremental decode with a pre-allocated KV cache.

`forward_cached(model, idx, cache)` runs the new tokens `idx` (B, T) at positions
[cache.length, cache.length + T) and returns their logits, reading the keys and values of
the earlier positions from `cache` and writing their own. Prefill is one call with the
prompt, decode one call per token (T = 1). It computes the same function as
`GPT.forward` in eval mode (tests/models/test_decode.py checks every variant token by
token); each mechanism gets a per-token step through the same seams as training
(the seams of models/mechanism.py):

- output mixing: the block's own `out_proj`, so Hadamard applies its FWHT + affine to each
  new token exactly as in the full forward;
- head selection: `STEP_BY_ATTENTION` (all heads, or BudgetFormer's per-token head sets);
- depth routing: `STEP_BY_DEPTH` (every block, or TSA's per-token routing).

What the cache holds (docs/inference.md, with the reasons):
- dense and Hadamard: K and V of every head at every position and layer;
- TSA: also for a token that halted before layer l, its K/V at layer l are those of its
  frozen state (the residual stream it carried out of its last executed block), as the full
  forward's dense attention computes them; a halted token in decode computes only those K/V
  (no query, no attention row, no output mixing, no FFN);
- BudgetFormer: K/V of every head at every position, whichever heads the position itself
  selected, so a later token that selects head h reads, at an earlier position that
  skipped h, that position's K/V of h computed from its own layer input: what the full
  forward reads. Plus the running sum of each layer's input, from which the prefix mean
  x_bar_t that drives the head decision of token t is updated in O(d).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from scalelab.models.budget_layers import BudgetAttention
from scalelab.models.dense_layers import FullDepth, MultiHeadAttention, merge_heads
from scalelab.models.tsa_layers import TokenSelectiveDepth, add_ffn_update


@dataclass
class KVCache:
    """Keys and values of every layer, allocated once for `capacity` positions.

    k, v: (n_layer, B, n_head, capacity, d_head); pool_sum: (n_layer, B, width), fp32, the
    state per layer that a component of the model carries between steps
    (`Component.decode_state`: BudgetFormer's running sum of each layer's input, width
    d_model), None when none declares any; length: the positions filled so far."""

    k: Tensor
    v: Tensor
    pool_sum: Tensor | None
    length: int = 0

    @classmethod
    def allocate(cls, model: nn.Module, batch: int, capacity: int) -> KVCache:
        cfg = model.cfg
        if capacity > cfg.block_size:
            raise ValueError(
                f"{capacity} positions exceed the model's block_size {cfg.block_size} "
                "(learned positional embeddings end there)"
            )
        weight = model.wte.weight
        shape = (cfg.n_layer, batch, cfg.n_head, capacity, cfg.d_head)
        k = torch.empty(shape, dtype=weight.dtype, device=weight.device)
        stateful = [(c, w) for c in cfg.components if (w := c.decode_state(cfg))]
        if len(stateful) > 1:
            raise NotImplementedError(
                "the cache holds one component's decode state; "
                f"{' and '.join(type(c).__name__ for c, _ in stateful)} each declare one"
            )
        pool = None
        if stateful:
            pool = torch.zeros(cfg.n_layer, batch, stateful[0][1], dtype=torch.float32,
                               device=weight.device)  # fmt: skip
        return cls(k, torch.empty_like(k), pool)

    @property
    def capacity(self) -> int:
        return self.k.size(3)

    @property
    def nbytes(self) -> int:
        extra = self.pool_sum.nbytes if self.pool_sum is not None else 0
        return self.k.nbytes + self.v.nbytes + extra


@torch.no_grad()
def forward_cached(
    model: nn.Module, idx: Tensor, cache: KVCache, logits: Literal["all", "last"] = "all"
) -> Tensor:
    """Logits of the new tokens `idx` (B, T): (B, T, V), or (B, V) of the last one."""
    cfg = model.cfg
    if cfg.task != "lm":
        raise ValueError("cached decoding needs an LM (task='lm'), not the classifier")
    if model.training:
        raise ValueError("cached decoding computes the inference path: call model.eval()")
    B, T = idx.shape
    start, end = cache.length, cache.length + T
    if B != cache.k.size(1) or end > cache.capacity:
        raise ValueError(
            f"batch {B} x positions [{start}, {end}) do not fit the cache "
            f"(batch {cache.k.size(1)}, capacity {cache.capacity})"
        )
    x = model.wte(idx) + model.wpe(torch.arange(start, end, device=idx.device))
    step = STEP_BY_DEPTH.get(type(model.depth))
    if step is None:
        raise NotImplementedError(f"no cached decode step for {type(model.depth).__name__}")
    x = step(model, x, _Step(cache, start))
    cache.length = end
    return model.readout(x if logits == "all" else x[:, -1])


@dataclass(frozen=True)
class _Step:
    cache: KVCache
    start: int  # position of the first new token

    def attention(self, block: nn.Module, layer: int, x: Tensor, need: Tensor | None) -> Tensor:
        """Block `layer`'s attention update of x (B, T, d) with the cache. `need` (B, T):
        the tokens whose update is used (None: all); the others only write their K/V."""
        step = STEP_BY_ATTENTION.get(type(block.attn))
        if step is None:
            raise NotImplementedError(f"no cached decode step for {type(block.attn).__name__}")
        return step(block.attn, block.ln_1(x), self, layer, need)

    def write_kv(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store k, v (B, H, T, d_head) at the new positions; all keys and values so far."""
        end = self.start + k.size(2)
        self.cache.k[layer, :, :, self.start : end] = k
        self.cache.v[layer, :, :, self.start : end] = v
        return self.cache.k[layer, :, :, :end], self.cache.v[layer, :, :, :end]

    def causal_mask(self, T: int, device: torch.device) -> Tensor | None:
        """(T, start + T): new token i sees positions <= start + i (None for one token)."""
        if T == 1:
            return None
        keys = torch.arange(self.start + T, device=device)
        return keys <= torch.arange(self.start, self.start + T, device=device)[:, None]


# --- head selection ------------------------------------------------------------------------


def _attend(attn: MultiHeadAttention, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=attn.scale)


def _split(t: Tensor, n_head: int) -> Tensor:
    """(B, T, n_head * d_head) -> (B, n_head, T, d_head)."""
    B, T, _ = t.shape
    return t.view(B, T, n_head, -1).transpose(1, 2)


def all_heads_step(
    attn: MultiHeadAttention, a: Tensor, step: _Step, layer: int, need: Tensor | None
) -> Tensor:
    """Every head. With `need`, a sequence none of whose new tokens needs the update (a
    halted token in decode) computes only its K/V: no query, attention or mixing."""
    B, T, d = a.shape
    if need is None or bool(need.all()):
        q, k, v = attn.split_heads(a)
        keys, values = step.write_kv(layer, k, v)
        return attn.out_proj(
            merge_heads(_attend(attn, q, keys, values, step.causal_mask(T, a.device)))
        )
    w, b = attn.c_attn.weight, attn.c_attn.bias
    kv = F.linear(a, w[d:], None if b is None else b[d:])
    k, v = (_split(t, attn.n_head) for t in kv.split(d, dim=-1))
    keys, values = step.write_kv(layer, k, v)
    out = a.new_zeros(B, T, d)
    rows = need.any(dim=1).nonzero().squeeze(1)  # sequences with a token that needs it
    if rows.numel():
        q = _split(F.linear(a[rows], w[:d], None if b is None else b[:d]), attn.n_head)
        y = _attend(attn, q, keys[rows], values[rows], step.causal_mask(T, a.device))
        out[rows] = attn.out_proj(merge_heads(y))
    return out


def budget_heads_step(
    attn: BudgetAttention, a: Tensor, step: _Step, layer: int, need: Tensor | None
) -> Tensor:
    """BudgetFormer's hard path: each token's k most relevant heads, decided from the prefix
    mean of the layer input. K/V of every head are written; Q, the attention rows and the
    output mixing run for the heads some new token of the batch selected (the union; all
    heads once the union is a third of them), with each token's other heads zeroed before
    the mixing."""
    B, T, d = a.shape
    H, dh = attn.n_head, attn.d_head
    pool = step.cache.pool_sum
    running = a.float().cumsum(dim=1) + pool[layer].unsqueeze(1)
    pool[layer] = running[:, -1]
    count = torch.arange(step.start + 1, step.start + T + 1, device=a.device).float()
    s, r = attn.decide((running / count[:, None]).to(a.dtype))
    _, active = attn.hard_mask(s, r)  # (B, T, H)
    if need is not None:
        active = active & need.unsqueeze(-1)
    w, b = attn.c_attn.weight, attn.c_attn.bias
    kv = F.linear(a, w[d:], None if b is None else b[d:])
    k, v = (_split(t, H) for t in kv.split(d, dim=-1))
    keys, values = step.write_kv(layer, k, v)
    heads = active.flatten(0, 1).any(dim=0).nonzero().squeeze(1)
    U = heads.numel()
    if U == 0:  # every new token halted (TSA): nothing reads this update
        return a.new_zeros(B, T, d)
    # Gathering U heads' cached K/V reads and writes U head-caches and attention reads the
    # copy again (3U); attending with every head reads H. From U = H/3 on every head moves
    # fewer bytes (the other heads' outputs are masked).
    every = 3 * U >= H
    if every:
        heads, U = torch.arange(H, device=a.device), H
    w_q = w[:d].view(H, dh, d)
    w_q = (w_q if every else w_q.index_select(0, heads)).reshape(U * dh, d)
    b_q = None if b is None else (b[:d].view(H, dh) if every else b[:d].view(H, dh)[heads])
    q = _split(F.linear(a, w_q, None if b_q is None else b_q.reshape(-1)), U)
    if not every:
        keys, values = keys.index_select(1, heads), values.index_select(1, heads)
    y = _attend(attn, q, keys, values, step.causal_mask(T, a.device))  # (B, U, T, dh)
    selected = active if every else active.index_select(2, heads)
    y = y * selected.permute(0, 2, 1).unsqueeze(-1).to(y.dtype)
    y = merge_heads(y)  # (B, T, U dh)
    if isinstance(attn.out_proj, nn.Linear):
        w_o = attn.out_proj.weight
        if not every:
            w_o = w_o.view(d, H, dh).index_select(1, heads).reshape(d, U * dh)
        return F.linear(y, w_o, attn.out_proj.bias)
    if not every:  # a structured mixer (Hadamard) mixes all H * d_head channels
        buf = a.new_zeros(B, T, H, dh)
        buf[:, :, heads] = y.view(B, T, U, dh)
        y = buf.view(B, T, d)
    return attn.out_proj(y)


STEP_BY_ATTENTION: dict[type, Callable[..., Tensor]] = {
    MultiHeadAttention: all_heads_step,
    BudgetAttention: budget_heads_step,
}


# --- depth routing -------------------------------------------------------------------------


def full_depth_step(model: nn.Module, x: Tensor, step: _Step) -> Tensor:
    for layer, block in enumerate(model.blocks):
        x = x + step.attention(block, layer, x, None)
        x = x + block.mlp_update(x)
    return x


def token_selective_step(model: nn.Module, x: Tensor, step: _Step) -> Tensor:
    """TSA with the eval gates of models/tsa_layers.py: binary under `sparse_inference` (a
    halted token writes its K/V and skips the attention update and the FFN), else soft."""
    depth: TokenSelectiveDepth = model.depth
    blocks = model.blocks
    x = x + step.attention(blocks[0], 0, x, None)  # f_0 always runs
    x = x + blocks[0].mlp_update(x)
    for layer, (router, block) in enumerate(zip(depth.routers, blocks[1:], strict=True), 1):
        p = router(x)
        if not depth.sparse_inference:
            g = (1.0 - p).unsqueeze(-1)
            x = x + g * step.attention(block, layer, x, None)
            x = x + g * block.mlp_update(x)
            continue
        active = p <= depth.threshold
        update = step.attention(block, layer, x, active)
        x = torch.addcmul(x, active.unsqueeze(-1).to(x.dtype), update)  # fresh: ours
        n_active = int(active.sum())
        if n_active == active.numel():
            x = x + block.mlp_update(x)
        elif n_active:
            x = add_ffn_update(block, x, active, "sparse")
    return x


STEP_BY_DEPTH: dict[type, Callable[[nn.Module, Tensor, _Step], Tensor]] = {
    FullDepth: full_depth_step,
    TokenSelectiveDepth: token_selective_step,
}
