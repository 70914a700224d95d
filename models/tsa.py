"""Token-Selective Attention (TSA): learned per-token depth routing: the mechanism, its
config and its counts (torch-free; the routers and the routed depth, with the paper's
equations: models/tsa_layers.py, docs/reproducing/tsa.md).

After block f_l a router r_l gives every token a halt probability p_l; the next block's
residual updates are scaled by g_l = 1 - p_l (training) or skipped when p_l > threshold
(inference). alpha is the active fraction of routed token-layers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import field_validator

from scalelab.models.dense import AllBlocks
from scalelab.models.mechanism import (
    Activations,
    ActiveFractions,
    Column,
    FlopCount,
    Mechanism,
    MechanismConfig,
    MetricPlot,
)
from scalelab.models.tsa_counts import tsa_router_hidden

if TYPE_CHECKING:
    from torch import nn

    from scalelab.models.config import ModelConfig


class TSAConfig(MechanismConfig):
    """`model.tsa`: per-token halt probabilities."""

    lambda_depth: float = 0.0  # lambda: weight of L_depth = lambda * mean(1 - p_l)
    threshold: float = 0.5  # inference: a token halts before block l+1 when p_l > threshold
    sparse_inference: bool = True  # eval: skip halted tokens' FFN (gather/scatter)
    router_activation: Literal["gelu", "relu"] = "gelu"  # between the router's two layers

    @field_validator("lambda_depth")
    @classmethod
    def _non_negative(cls, value: float) -> float:
        if value < 0:
            raise ValueError(f"must be >= 0 (a depth penalty, not a reward), got {value}")
        return value

    @field_validator("threshold")
    @classmethod
    def _open_unit_interval(cls, value: float) -> float:
        if not 0.0 < value < 1.0:
            raise ValueError(f"must be in (0, 1), got {value}")
        return value


class TokenSelective(Mechanism, AllBlocks):
    """Registered as `tsa`, at the depth-routing seam."""

    name = "tsa"
    config = TSAConfig
    order = 30
    metrics = ("tsa/alpha", "tsa/tlops_saved")
    losses = ("tsa/depth",)
    columns = (
        Column("tsa_lambda", "config:lambda_depth", label="λ (weight of the depth loss)"),
        Column("tsa_threshold", "config:threshold", label="halt threshold"),
        Column("tsa_alpha", "metric:tsa/alpha", label="α (active fraction of token-layers)"),
        Column("tsa_tlops_saved", "metric:tsa/tlops_saved", label="TLOps saved"),
    )
    plots = (
        MetricPlot(
            "tsa_alpha",
            y="tsa_alpha",
            x=("tsa_lambda", "n_params"),
            series="size",
            title="TSA: active fraction α",
            ylim=(0.0, 1.0),
        ),
    )

    def check(self, model: ModelConfig) -> None:
        if model.n_layer < 2:
            raise ValueError(
                f"tsa needs n_layer >= 2 (block 0 always runs; routers sit between blocks), "
                f"got n_layer={model.n_layer}"
            )

    def parameter_sizes(self, model: ModelConfig) -> list[int]:
        d, r = model.d_model, tsa_router_hidden(model.d_model)
        return [r * d, r, r, 1] * (model.n_layer - 1)  # routers r_0 .. r_{L-2}: d -> r -> 1

    def activations(self, model: ModelConfig, seq_len: int) -> Activations:
        # per routed block (all but the first), kept under checkpointing: the gated updates
        # 2 h, the router's 2 r + 2 (tests/orchestrator/test_memory_activations.py)
        h, r = model.d_model, tsa_router_hidden(model.d_model)
        return Activations(outside=2 * h + 2 * r + 2, outside_blocks=model.n_layer - 1)

    def forward_flops(self, model: ModelConfig, seq_len: int, active: ActiveFractions) -> FlopCount:
        d, r = model.d_model, tsa_router_hidden(model.d_model)
        # the routers run for every token (they decide); biases not counted
        return FlopCount(mechanisms=(model.n_layer - 1) * 2 * (d * r + r))

    def mlp_passes(self, model: ModelConfig, active: ActiveFractions) -> float:
        return 1 + (model.n_layer - 1) * active.ffn_tokens  # block 0 always runs in full

    def build(self, model: ModelConfig) -> nn.Module:
        from scalelab.models.tsa_layers import TokenSelectiveDepth

        return TokenSelectiveDepth(model, self.settings(model))
