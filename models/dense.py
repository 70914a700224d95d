"""The dense baseline at the three seams: all heads (multi-head self-attention), a dense
output projection W_O, and every token through every block.

Each seam's dense component (models/mechanism.py) gives its counts here, torch-free (the CLI
validates and plans sweeps with them), and builds its module from models/dense_layers.py; a
mechanism derives from the one it replaces.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from scalelab.models.mechanism import (
    ActiveFractions,
    DepthRouting,
    FlopCount,
    HeadSelection,
    OutputMixing,
)

if TYPE_CHECKING:
    from torch import nn

    from scalelab.models.config import ModelConfig


class DenseOutputMixing(OutputMixing):
    """W_O: a d x d matrix (and bias) per layer."""

    def parameter_sizes(self, model: ModelConfig) -> list[int]:
        d = model.d_model
        return [d * d, *([d] if model.has_attn_out_bias else [])] * model.n_layer

    def forward_flops(self, model: ModelConfig, seq_len: int, active: ActiveFractions) -> FlopCount:
        return FlopCount(output_mixing=model.n_layer * 2 * model.d_model**2 * active.heads)

    def selected_head_flops(self, model: ModelConfig) -> float:
        return 2 * model.d_head * model.d_model  # the head's d_head columns of W_O

    def build(self, model: ModelConfig, layer_idx: int) -> nn.Module:
        from scalelab.models.dense_layers import DenseOutputProjection

        return DenseOutputProjection(model)


class AllHeads(HeadSelection):
    """Every head runs (the attention's Q/K/V and scores are the backbone's counts)."""

    def build(self, model: ModelConfig, layer_idx: int, out_proj: nn.Module) -> nn.Module:
        from scalelab.models.dense_layers import MultiHeadAttention

        return MultiHeadAttention(model, layer_idx, out_proj)


class AllBlocks(DepthRouting):
    """Every token goes through every block."""

    def build(self, model: ModelConfig) -> nn.Module:
        from scalelab.models.dense_layers import FullDepth

        return FullDepth()
