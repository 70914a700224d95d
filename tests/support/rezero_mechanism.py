"""ReZero residual gates (Bachlechner et al. 2020) at the depth-routing seam.

Every block's two residual updates are scaled by learned scalars that start at zero,

    x <- x + a_l * Attn(LN(x))        x <- x + m_l * FFN(LN(x))        a_l, m_l in R, init 0

so the network starts as the identity map of its embeddings and learns how much of each
block to let in. This file is everything scalelab needs to know about the mechanism: the
config, the module at its seam, the counts (parameters, activations), the metric, the
result columns and the plot.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from pydantic import Field
from torch import Tensor, nn

from scalelab.models.context import ForwardContext
from scalelab.models.dense import AllBlocks
from scalelab.models.mechanism import Activations, Column, Mechanism, MechanismConfig, MetricPlot

if TYPE_CHECKING:
    from scalelab.models.config import ModelConfig


class ReZeroConfig(MechanismConfig):
    """`model.rezero` in a sweep; `variants: [dense, rezero]` switches it on."""

    init: float = Field(0.0, description="a_l and m_l at initialisation (the paper: 0)")


class ReZeroDepth(nn.Module):
    """Every token through every block, each residual update scaled by its block's gate."""

    def __init__(self, n_layer: int, init: float) -> None:
        super().__init__()
        self.init = init
        self.attn_gate = nn.Parameter(torch.empty(n_layer))  # a_l
        self.mlp_gate = nn.Parameter(torch.empty(n_layer))  # m_l
        self.reset_parameters()

    def reset_parameters(self) -> None:  # also how a model built on the meta device gets them
        nn.init.constant_(self.attn_gate, self.init)
        nn.init.constant_(self.mlp_gate, self.init)

    def forward(self, x: Tensor, blocks: nn.ModuleList, ctx: ForwardContext) -> Tensor:
        for a, m, block in zip(self.attn_gate, self.mlp_gate, blocks, strict=True):
            x = x + a * block.attn_update(x, ctx)
            x = x + m * block.mlp_update(x)
        gates = torch.cat([self.attn_gate, self.mlp_gate])
        ctx.add_metric("rezero/gate_abs_mean", gates.abs().mean())
        return x


class ReZero(Mechanism, AllBlocks):
    """Registered as `rezero`: the variant name, the `model.rezero` key, the metric prefix."""

    name = "rezero"
    config = ReZeroConfig
    order = 40  # after hadamard (10), budget (20) and tsa (30) in variant names
    metrics = ("rezero/gate_abs_mean",)
    columns = (
        Column("rezero_init", "config:init", label="gate at initialisation"),
        Column("rezero_gate", "metric:rezero/gate_abs_mean", label="mean |gate| after training"),
    )
    plots = (MetricPlot("rezero_gate", y="rezero_gate", title="ReZero: gates against model size"),)

    def parameter_sizes(self, model: ModelConfig) -> list[int]:
        return [model.n_layer, model.n_layer]  # a_l and m_l (scaling by them is not a matmul)

    def activations(self, model: ModelConfig, seq_len: int) -> Activations:
        # each gate keeps the update it scales for its own gradient, in every block
        return Activations(outside=2 * model.d_model, outside_blocks=model.n_layer)

    def build(self, model: ModelConfig) -> nn.Module:
        return ReZeroDepth(model.n_layer, self.settings(model).init)
