"""Hadamard output projection (the attention-mixing seam's structured alternative): the
mechanism, its config and its counts (torch-free; the module: models/hadamard_layers.py).

Attention's dense output projection W_O (d x d weights + d bias) is replaced by a fixed,
orthonormal Walsh-Hadamard transform followed by a learned diagonal affine:

    MHA_had(X) = alpha * (Y H / sqrt(d)) + beta        Y: concatenated heads, alpha, beta in R^d

H is parameter-free (kernels.hadamard), so each block trades d^2 + d parameters for 2d and
O(d^2) mixing FLOPs for O(d log d).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import Field

from scalelab.contract.config import NotIdentity
from scalelab.kernels.sizes import nearest_supported_sizes, supported_hadamard_size, transform_flops
from scalelab.models.mechanism import (
    ActiveFractions,
    FlopCount,
    Mechanism,
    MechanismConfig,
    OutputMixing,
)

if TYPE_CHECKING:
    from torch import nn

    from scalelab.models.config import ModelConfig


class HadamardConfig(MechanismConfig):
    """`model.hadamard: {}` (or the older `model.attn_out: hadamard`)."""

    backend: Annotated[Literal["auto", "triton", "torch"], NotIdentity] = Field(
        "auto",
        description="which kernel computes the transform (placement, not in the trial id): "
        "auto = the Triton kernel on CUDA after a one-time self-check, else (or if it fails "
        "to compile or the check) the torch path, with a warning and the run tag "
        "scalelab.hadamard_backend; triton = the Triton kernel, a failure is an error; "
        "torch = the torch path (kernels/backend.py)",
    )


class Hadamard(Mechanism, OutputMixing):
    """Registered as `hadamard`. The transform is counted as executed
    (kernels.sizes.transform_flops); its backward costs 2x its forward like a matmul's. It
    keeps no activations beyond W_O's (its input, as W_O keeps)."""

    name = "hadamard"
    config = HadamardConfig
    order = 10

    def check(self, model: ModelConfig) -> None:
        if not supported_hadamard_size(model.d_model):
            raise ValueError(
                f"hadamard needs a d_model with a Hadamard matrix; "
                f"d_model={model.d_model} has none (nearest supported: "
                f"{nearest_supported_sizes(model.d_model)})"
            )

    def parameter_sizes(self, model: ModelConfig) -> list[int]:
        return [model.d_model, model.d_model] * model.n_layer  # alpha and beta

    def forward_flops(self, model: ModelConfig, seq_len: int, active: ActiveFractions) -> FlopCount:
        return FlopCount(output_mixing=model.n_layer * transform_flops(model.d_model))

    def build(self, model: ModelConfig, layer_idx: int) -> nn.Module:
        from scalelab.models.hadamard_layers import HadamardOutputProjection

        return HadamardOutputProjection(model, self.settings(model).backend)
