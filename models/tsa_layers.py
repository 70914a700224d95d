"""Token-Selective Attention (TSA)'s modules: the routers and the routed depth (the
mechanism, its config and its counts: models/tsa.py).

Symbols as in the paper: blocks f_0 .. f_{L-1} of a pre-norm decoder; after block f_l
(l = 0 .. L-2) a router r_l gives every token a halt probability p_l in (0, 1); the next
block's residual updates are scaled by the gate g_l = 1 - p_l:

    x <- x + g_l * Attn(LN(x))        x <- x + g_l * FFN(LN(x))          (block f_{l+1})

    L = L_task + L_depth,    L_depth = lambda * mean_{l, tokens}(1 - p_l)
    alpha = mean_{l, tokens}(1 - p_l)             (active fraction of routed token-layers)
    TLOps saved = 1 - (1 + (L - 1) * alpha) / L   (block f_0 always runs)

Training is fully soft: every block runs for every token. Inference (module in eval mode and
`cfg.tsa.sparse_inference`) uses the binary gate g_l = [p_l <= threshold]: a halted token
(p_l > threshold) gets no attention update (gate 0) and does not go through the FFN at all
(gather/scatter over the flattened B*T tokens); attention itself stays dense, so every
token's keys and values are computed exactly. Router decisions read one token's hidden
state only, so causality is untouched. In eval without `sparse_inference` the soft gates of
training are used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from scalelab.models.context import ForwardContext, masked_mean
from scalelab.models.parametrization import set_role
from scalelab.models.tsa_counts import tlops_saved, tsa_router_hidden

if TYPE_CHECKING:
    from scalelab.models.config import ModelConfig
    from scalelab.models.tsa import TSAConfig

ROUTER_INIT_BIAS = -1.0  # sigmoid(-1) = 0.269: every token starts with p ~ 0.27

# Dense fallback: the gather/scatter FFN costs a fixed ~0.05-0.5 ms (nonzero, index kernels,
# thread wake-ups) plus a copy of each active row; it pays once the skipped rows' FFN work
# exceeds that. Measured per block on CPU (d = 256 and 512, 1 and 2 threads; see
# docs/benchmarks.md): break-even near 95% active for >= 256 tokens, ties or losses below
# ~32 skipped tokens. Both limits keep a margin.
MIN_SKIPPED_TOKENS = 32
MAX_ACTIVE_FRACTION = 0.9


def use_sparse_ffn(n_active: int, n_tokens: int) -> bool:
    """The fallback rule: gather/scatter only when enough tokens are skipped to pay for it."""
    skipped = n_tokens - n_active
    return skipped >= MIN_SKIPPED_TOKENS and n_active <= MAX_ACTIVE_FRACTION * n_tokens


class Router(nn.Module):
    """r_l: d -> r -> 1 with a sigmoid, r = max(16, d // 4) (tsa_router_hidden); GELU or
    ReLU between the layers (`tsa.router_activation`).

    Width roles (models/parametrization.py): fc is a hidden matrix (r grows with d), out an
    output layer (r -> 1)."""

    def __init__(self, d_model: int, activation: str = "gelu") -> None:
        super().__init__()
        hidden = tsa_router_hidden(d_model)
        self.fc = nn.Linear(d_model, hidden)
        self.act = nn.ReLU() if activation == "relu" else nn.GELU()
        self.out = set_role(nn.Linear(hidden, 1), "output")

    def post_init(self) -> None:
        # Weights keep the backbone's fan-in init, so p starts spread around
        # sigmoid(-1) = 0.27 and the router gets gradient through both layers.
        nn.init.constant_(self.out.bias, ROUTER_INIT_BIAS)

    def forward(self, x: Tensor) -> Tensor:
        """(B, T, d) -> p, (B, T): the halt probability of every token."""
        return torch.sigmoid(self.out(self.act(self.fc(x)))).squeeze(-1)


class TokenSelectiveDepth(nn.Module):
    """Depth routing with routers r_0 .. r_{L-2} between the blocks."""

    def __init__(self, cfg: ModelConfig, tsa: TSAConfig) -> None:
        super().__init__()
        assert cfg.n_layer >= 2  # enforced by TokenSelective.check
        self.lambda_depth = tsa.lambda_depth
        self.threshold = tsa.threshold
        self.sparse_inference = tsa.sparse_inference
        self.routers = nn.ModuleList(
            Router(cfg.d_model, tsa.router_activation) for _ in range(cfg.n_layer - 1)
        )
        self.force_path: str | None = None  # 'sparse' | 'dense': override the rule (tests)

    def forward(self, x: Tensor, blocks: nn.ModuleList, ctx: ForwardContext) -> Tensor:
        binary = not self.training and self.sparse_inference
        x = blocks[0](x, ctx)  # f_0 always runs
        gates = []
        for router, block in zip(self.routers, blocks[1:], strict=True):
            p = router(x)
            if binary:
                active = p <= self.threshold
                gates.append(active.float())
                x = self.gated_block(block, x, active, ctx)
            else:
                g = 1.0 - p
                gates.append(g)
                x = x + g.unsqueeze(-1) * block.attn_update(x, ctx)
                x = x + g.unsqueeze(-1) * block.mlp_update(x)
        self._record(torch.stack(gates), len(blocks), ctx)
        return x

    def gated_block(
        self, block: nn.Module, x: Tensor, active: Tensor, ctx: ForwardContext
    ) -> Tensor:
        """Block f_{l+1} with the binary gate: dense attention (update kept only for active
        tokens), FFN for active tokens only."""
        gate = active.unsqueeze(-1).to(x.dtype)
        x = torch.addcmul(x, gate, block.attn_update(x, ctx))  # a fresh tensor: see below
        return add_ffn_update(block, x, active, self._path(active))

    def _path(self, active: Tensor) -> str:
        if self.force_path is not None:
            return self.force_path
        n_active = int(active.sum())  # one host sync per routed block
        return "sparse" if use_sparse_ffn(n_active, active.numel()) else "dense"

    def _record(self, gates: Tensor, n_layer: int, ctx: ForwardContext) -> None:
        """gates: (L-1, B, T) of 1 - p (soft) or of the executed 0/1 decisions (sparse)."""
        alpha_mean = masked_mean(gates, ctx.pad_mask)  # encoder: padded tokens do not count
        if self.training:
            ctx.add_loss("tsa/depth", self.lambda_depth * alpha_mean)
        ctx.add_metric("tsa/alpha", alpha_mean)
        ctx.add_metric("tsa/tlops_saved", tlops_saved(alpha_mean, n_layer))


def add_ffn_update(block: nn.Module, x: Tensor, active: Tensor, path: str = "sparse") -> Tensor:
    """x plus the FFN residual update of `block` for the tokens where `active` (B, T) is
    True, written into x IN PLACE (x must be a tensor the caller owns, e.g. the output of the
    attention residual; safe under autograd: index_select keeps only the indices).
    'sparse': gather the active rows of the flattened (B*T, d) states, run LN + FFN on them
    only and add the result back into their rows (one index_select and one index_add_; no
    full-size zero buffer or extra add). 'dense': every token through the
    FFN, the update masked (one fused addcmul, out of place)."""
    if path == "dense":
        # out of place: LayerNorm keeps x for its backward when gradients are on
        return torch.addcmul(x, active.unsqueeze(-1).to(x.dtype), block.mlp_update(x))
    flat = x.view(-1, x.size(-1))
    rows = active.reshape(-1).nonzero().squeeze(1)  # host sync on GPU (output size)
    flat.index_add_(0, rows, block.mlp_update(flat.index_select(0, rows)))
    return x
