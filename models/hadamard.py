"""Hadamard output projection (the attention-mixing seam's structured alternative).

Attention's dense output projection W_O (d x d weights + d bias) is replaced by a fixed,
orthonormal Walsh-Hadamard transform followed by a learned diagonal affine:

    MHA_had(X) = alpha * (Y H / sqrt(d)) + beta        Y: concatenated heads, alpha, beta in R^d

H is parameter-free (kernels.hadamard), so each block trades d^2 + d parameters for 2d and
O(d^2) mixing FLOPs for O(d log d).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Annotated, Literal

import torch
from pydantic import Field
from torch import Tensor, nn

from scalelab.contract.config import NotIdentity
from scalelab.kernels import backend as kernel_backend
from scalelab.kernels.hadamard import hadamard_transform_affine
from scalelab.kernels.sizes import nearest_supported_sizes, supported_hadamard_size, transform_flops
from scalelab.models.mechanism import (
    ActiveFractions,
    FlopCount,
    Mechanism,
    MechanismConfig,
    OutputMixing,
)
from scalelab.models.parametrization import init_std

if TYPE_CHECKING:
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
    (kernels.sizes.transform_flops); its backward costs 2x its forward like a matmul's."""

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

    def params(self, model: ModelConfig) -> int:
        return model.n_layer * 2 * model.d_model  # alpha and beta

    def forward_flops(self, model: ModelConfig, seq_len: int, active: ActiveFractions) -> FlopCount:
        return FlopCount(output_mixing=model.n_layer * transform_flops(model.d_model))

    def build(self, model: ModelConfig, layer_idx: int) -> nn.Module:
        return HadamardOutputProjection(model, self.settings(model).backend)


def kernels_used() -> dict[str, kernel_backend.Use]:
    """Which kernel computed this process's Hadamard transforms, by width, dtype and device,
    and why `auto` fell back where it did (kernels/backend.py; the run's tag)."""
    return kernel_backend.used()


class HadamardOutputProjection(nn.Module):
    def __init__(self, cfg: ModelConfig, backend: str = "auto") -> None:
        super().__init__()
        self.d_model = cfg.d_model
        self.backend = backend
        # The dense baseline's W_O is drawn with the residual std (0.02/sqrt(2L), and
        # x m^-1/2 under µP), which scales the variance of its output by d * std^2.
        # H/sqrt(d) is orthonormal and preserves it, so alpha starts at sqrt(d) * std: the
        # block output has the baseline's variance at init (alpha = 1 would make every
        # attention update ~sqrt(d) * std^-1 times louder). Under µP this alpha_init is the
        # same at every width, and alpha and beta are vector-like (learning rate unscaled).
        std = init_std(cfg, "residual", cfg.d_model)
        self.alpha_init = math.sqrt(cfg.d_model) * std
        self.alpha = nn.Parameter(torch.empty(cfg.d_model))
        self.beta = nn.Parameter(torch.empty(cfg.d_model))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.constant_(self.alpha, self.alpha_init)
        nn.init.zeros_(self.beta)

    def forward(self, y: Tensor) -> Tensor:
        return hadamard_transform_affine(y, self.alpha, self.beta, backend=self.backend)

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, alpha_init={self.alpha_init:.4g}, backend={self.backend}"
