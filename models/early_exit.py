"""Early exit by confidence threshold: the baseline TSA is compared with at matched alpha.

After each block f_l (l = 0 .. L-2) every still-running token reads out its logits through
the model's own head (`model.readout` = LN_f then the LM head); a token whose maximum
softmax probability is >= `threshold` exits. An exited token's hidden state is frozen: the
later blocks' attention and FFN residual updates are skipped for it (the FFN through the
same gather/scatter as TSA's sparse inference). Attention stays dense, so later layers
still compute keys and values from the exited token's frozen state (CALM-style state
propagation) and the tokens after it attend to it as usual; decisions depend on a token's
own state only, so the model stays causal. The final logits of an exited token are the ones
it exited with (its state does not change afterwards).

The active fraction is defined as TSA's alpha: the share of (routed block, token) pairs
l = 1 .. L-1 that run, block f_0 always running; TLOps saved follows from it the same way.
The routing of the model itself (e.g. TSA's routers) is not used: every block is applied as
in the dense model.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from scipy.optimize import bisect
from torch import Tensor

from scalelab.models.context import ForwardContext
from scalelab.models.tsa_counts import tlops_saved
from scalelab.models.tsa_layers import add_ffn_update


@dataclass
class EarlyExitOutput:
    logits: Tensor  # (B, T, V): each token's logits at its exit layer
    alpha: float  # active fraction of the routed blocks 1 .. L-1
    tlops_saved: float
    exit_layer: Tensor  # (B, T): index of the last block each token ran


@torch.no_grad()
def early_exit_logits(model: torch.nn.Module, idx: Tensor, threshold: float) -> EarlyExitOutput:
    """Run the LM `model` (models.gpt.GPT) with confidence-threshold early exit."""
    B, T = idx.shape
    ctx = ForwardContext(readout=model.readout)
    x = model.embed(idx)
    active = torch.ones(B, T, dtype=torch.bool, device=idx.device)
    exit_layer = torch.zeros(B, T, dtype=torch.long, device=idx.device)
    executed = []
    blocks = model.blocks
    for layer, block in enumerate(blocks):
        if layer == 0:  # f_0 always runs
            x = block(x, ctx)
        else:
            executed.append(active.float().mean())
            x = x + active.unsqueeze(-1).to(x.dtype) * block.attn_update(x, ctx)
            path = "dense" if bool(active.all()) else "sparse"
            x = add_ffn_update(block, x, active, path)  # x: the fresh sum above, ours to update
            exit_layer[active] = layer
        if layer < len(blocks) - 1:
            confidence = ctx.readout(x).softmax(-1).amax(-1)
            active = active & (confidence < threshold)
    alpha = torch.stack(executed).mean().item()
    return EarlyExitOutput(model.readout(x), alpha, tlops_saved(alpha, len(blocks)), exit_layer)


def threshold_for_active_fraction(
    model: torch.nn.Module, idx: Tensor, target_alpha: float, xtol: float = 1e-7
) -> float:
    """The confidence threshold at which early exit runs `target_alpha` of the routed
    token-layers on the validation batch `idx` (bisection; alpha rises with the threshold).
    A target outside what thresholds in (0, 1] can reach gives the nearest end."""
    low, high = 1e-6, 1.0  # exit nearly everything ... exit only at probability 1

    def gap(threshold: float) -> float:
        return early_exit_logits(model, idx, threshold).alpha - target_alpha

    if gap(low) >= 0:
        return low
    if gap(high) <= 0:
        return high
    return bisect(gap, low, high, xtol=xtol)
