"""The Hadamard output projection's module (the mechanism and its config:
models/hadamard.py): MHA_had(X) = alpha * (Y H / sqrt(d)) + beta, the transform computed by
kernels.hadamard."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from scalelab.kernels import backend as kernel_backend
from scalelab.kernels.hadamard import hadamard_transform_affine
from scalelab.models.parametrization import init_std

if TYPE_CHECKING:
    from scalelab.models.config import ModelConfig


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
