"""Typed, frozen configuration of one model (torch-free: the CLI and orchestrator import it).

A mechanism is switched on by giving its sub-config (`budget`, `tsa`) or choosing its
component (`attn_out`); absent means the dense GPT baseline. Only fields that change the
science live here, so the content hash of a trial is stable across machines.
"""

from __future__ import annotations

from typing import Literal

from pydantic import field_validator, model_validator

from contract.config import FrozenConfig
from models.sizes import SIZES, SizePreset, get_size


class BudgetConfig(FrozenConfig):
    """BudgetFormer: per-input head budget s and per-head relevance (see models/budget.py;
    equations and defaults in docs/reproducing/budgetformer.md)."""

    s_min: float = 0.1  # target interval [s_min, s_max] of the budget s (paper: [0.1, 0.9])
    s_max: float = 0.9
    budget_hidden: int = 64  # f_theta: d -> budget_hidden -> 1
    tau_start: float = 5.0  # temperature tau: high = near-uniform relevance (exploration) ...
    tau_end: float = 0.05  # ... low = concentrated, near-hard top-k mask (exploitation)
    tau_schedule: Literal["linear", "cosine", "exponential"] = "exponential"
    gumbel_noise: bool = True  # exploration noise on the relevance logits (training only)
    budget_loss_weight: float = 1.0  # lambda_b: hinge on s outside [s_min, s_max]
    cost_weight: float = 0.05  # lambda_c: linear cost on s inside the interval (0: paper's form)
    cost_warmup: float = 0.0  # lambda_c ramps linearly from 0 over this fraction of training
    entropy_weight_start: float = -0.01  # lambda_e(0) < 0: reward spread early ...
    entropy_weight_end: float = 0.01  # ... lambda_e(1) > 0: penalise entropy late
    entropy_schedule: Literal["linear", "cosine", "constant"] = "linear"

    @field_validator("s_min", "s_max")
    @classmethod
    def _open_unit_interval(cls, value: float) -> float:
        if not 0.0 < value < 1.0:
            raise ValueError(f"a head fraction must be in (0, 1), got {value}")
        return value

    @field_validator("budget_hidden")
    @classmethod
    def _positive_width(cls, value: int) -> int:
        if value < 1:
            raise ValueError(f"must be a positive integer, got {value}")
        return value

    @field_validator("tau_start", "tau_end")
    @classmethod
    def _positive_temperature(cls, value: float) -> float:
        if value <= 0:
            raise ValueError(f"a temperature must be > 0, got {value}")
        return value

    @field_validator("budget_loss_weight", "cost_weight")
    @classmethod
    def _non_negative(cls, value: float) -> float:
        if value < 0:
            raise ValueError(f"must be >= 0 (a penalty, not a reward), got {value}")
        return value

    @field_validator("cost_warmup")
    @classmethod
    def _fraction_of_training(cls, value: float) -> float:
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"a fraction of training must be in [0, 1], got {value}")
        return value

    @model_validator(mode="after")
    def _ordered(self) -> BudgetConfig:
        if self.s_min >= self.s_max:
            raise ValueError(f"s_min={self.s_min} must be < s_max={self.s_max}")
        if self.tau_end > self.tau_start:
            raise ValueError(
                f"tau_end={self.tau_end} must be <= tau_start={self.tau_start} "
                "(the temperature anneals from exploration to exploitation)"
            )
        return self


class TSAConfig(FrozenConfig):
    """Token-Selective Attention: per-token halt probabilities (see models/tsa.py)."""

    lambda_depth: float = 0.0  # lambda: weight of L_depth = lambda * mean(1 - p_l)
    threshold: float = 0.5  # inference: a token halts before block l+1 when p_l > threshold
    sparse_inference: bool = True  # eval: skip halted tokens' FFN (gather/scatter)

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


class ModelConfig(FrozenConfig):
    """One model: a size preset (optionally overridden) plus the chosen mechanisms."""

    size: str
    n_layer: int | None = None  # None: the preset's value (filled in on validation)
    d_model: int | None = None
    n_head: int | None = None
    vocab_size: int = 50257
    block_size: int = 1024
    task: Literal["lm", "classify"] = "lm"
    n_classes: int | None = None
    dropout: float = 0.0
    bias: bool = True
    # How init and per-layer learning rates scale with width (models/parametrization.py):
    # 'mup' keeps the optimum learning rate found at mup_base_width for wider models.
    parametrization: Literal["standard", "mup"] = "standard"
    mup_base_width: int | None = None  # the d_model that µP's multipliers are relative to
    attn_out: Literal["dense", "hadamard"] = "dense"
    budget: BudgetConfig | None = None
    tsa: TSAConfig | None = None

    @field_validator("size")
    @classmethod
    def _known_size(cls, name: str) -> str:
        get_size(name)  # raises with the list of presets
        return name

    @field_validator("vocab_size", "block_size", "n_layer", "d_model", "n_head", "mup_base_width")
    @classmethod
    def _positive(cls, value: int | None) -> int | None:
        if value is not None and value < 1:
            raise ValueError(f"must be a positive integer, got {value}")
        return value

    @field_validator("dropout")
    @classmethod
    def _probability(cls, value: float) -> float:
        if not 0.0 <= value < 1.0:
            raise ValueError(f"must be in [0, 1), got {value}")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> ModelConfig:
        preset = get_size(self.size)
        for key in ("n_layer", "d_model", "n_head"):
            if getattr(self, key) is None:
                self.__dict__[key] = getattr(preset, key)  # frozen: resolve once, here
        if self.d_model % self.n_head != 0:
            raise ValueError(
                f"d_model={self.d_model} is not divisible by n_head={self.n_head}; "
                f"allowed n_head values: {_divisors(self.d_model)}"
            )
        if (self.parametrization == "mup") != (self.mup_base_width is not None):
            raise ValueError(
                "mup_base_width goes with parametrization='mup' (the width its learning rate "
                f"was tuned at), got parametrization={self.parametrization!r} and "
                f"mup_base_width={self.mup_base_width}"
            )
        if self.task == "classify" and (self.n_classes is None or self.n_classes < 2):
            raise ValueError("task='classify' needs n_classes >= 2")
        if self.task == "lm" and self.n_classes is not None:
            raise ValueError("n_classes is only allowed with task='classify'")
        if self.budget is not None and self.n_head < 2:
            raise ValueError(
                f"budget needs n_head >= 2 (it selects a subset of heads), got n_head={self.n_head}"
            )
        if self.tsa is not None and self.n_layer < 2:
            raise ValueError(
                f"tsa needs n_layer >= 2 (block 0 always runs; routers sit between blocks), "
                f"got n_layer={self.n_layer}"
            )
        if self.attn_out == "hadamard":
            from kernels.sizes import nearest_supported_sizes, supported_hadamard_size

            if not supported_hadamard_size(self.d_model):
                raise ValueError(
                    f"attn_out='hadamard' needs a d_model with a Hadamard matrix; "
                    f"d_model={self.d_model} has none (nearest supported: "
                    f"{nearest_supported_sizes(self.d_model)})"
                )
        return self

    @property
    def preset(self) -> SizePreset:
        return get_size(self.size)

    @property
    def causal(self) -> bool:
        return self.task == "lm"

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_head

    @property
    def variant(self) -> str:
        """Canonical variant name, e.g. 'dense', 'hadamard', 'hadamard+budget+tsa'."""
        parts = [
            name
            for name, on in (
                ("hadamard", self.attn_out == "hadamard"),
                ("budget", self.budget is not None),
                ("tsa", self.tsa is not None),
            )
            if on
        ]
        return "+".join(parts) or "dense"


def _divisors(n: int) -> list[int]:
    return [k for k in range(1, min(n, 128) + 1) if n % k == 0]


__all__ = [
    "SIZES",
    "BudgetConfig",
    "ModelConfig",
    "TSAConfig",
]
