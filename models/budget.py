"""BudgetFormer: adaptive head budgeting for multi-head attention: the mechanism, its config
and its counts (torch-free; the attention module and the paper's equations:
models/budget_layers.py, docs/reproducing/budgetformer.md).

Per input, a budget s in (0, 1) says what fraction of the heads to run and a relevance per
head says which: inference runs the k = max(1, floor(s * H)) most relevant heads only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import field_validator, model_validator

from scalelab.models.budget_flops import budget_net_flops
from scalelab.models.dense import AllHeads
from scalelab.models.mechanism import (
    Activations,
    ActiveFractions,
    Column,
    FlopCount,
    Mechanism,
    MechanismConfig,
    MetricPlot,
)

if TYPE_CHECKING:
    from torch import nn

    from scalelab.models.config import ModelConfig


class BudgetConfig(MechanismConfig):
    """`model.budget`: per-input head budget s and per-head relevance (equations and
    defaults in docs/reproducing/budgetformer.md)."""

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


class BudgetFormer(Mechanism, AllHeads):
    """Registered as `budget`, at the head-selection seam."""

    name = "budget"
    config = BudgetConfig
    order = 20
    reads_training_progress = True  # its temperature and loss weights follow a schedule
    metrics = tuple(
        f"budget/{m}"
        for m in ("s_mean", "heads_active", "entropy", "tau", "attn_flops", "attn_flops_ratio")
    )
    losses = ("budget/budget", "budget/entropy")
    columns = (
        Column("budget_s_min", "config:s_min", label="s_min"),
        Column("budget_s_max", "config:s_max", label="s_max"),
        Column("budget_s_mean", "metric:budget/s_mean", label="mean budget s (fraction of heads)"),
        Column("budget_heads_active", "metric:budget/heads_active", label="heads active"),
    )
    plots = (
        MetricPlot(
            "budget_s_mean",
            y="budget_s_mean",
            title="BudgetFormer: learned head budget against model size",
            ylim=(0.0, 1.0),
        ),
    )

    def check(self, model: ModelConfig) -> None:
        if model.n_head < 2:
            raise ValueError(
                f"budget needs n_head >= 2 (it selects a subset of heads), got n_head={model.n_head}"
            )

    def parameter_sizes(self, model: ModelConfig) -> list[int]:
        d, h, H = model.d_model, self.settings(model).budget_hidden, model.n_head
        budget_net = [h * d, h, h, 1]  # f_theta: d -> h -> 1 (always biased)
        relevance_net = [H * d, H]  # g_phi: d -> H
        return [*budget_net, *relevance_net] * model.n_layer

    def activations(self, model: ModelConfig, seq_len: int) -> Activations:
        # soft top-k training, per block: 2 h + 2 budget_hidden + a^2 + 5 a + 4
        # (tests/orchestrator/test_memory_activations.py measures it)
        h, a = model.d_model, model.n_head
        return Activations(block=2 * h + 2 * self.settings(model).budget_hidden + a * a + 5 * a + 4)

    def decode_state(self, model: ModelConfig) -> int:
        return model.d_model  # the running sum of the layer's input: its prefix mean decides

    def forward_flops(self, model: ModelConfig, seq_len: int, active: ActiveFractions) -> FlopCount:
        # one decision per token (decoder) or per sequence (encoder)
        per_token = 1.0 if model.causal else 1.0 / seq_len
        return FlopCount(mechanisms=model.n_layer * budget_net_flops(model) * per_token)

    def heads(self, model: ModelConfig, active: ActiveFractions) -> float:
        return active.heads

    def build(self, model: ModelConfig, layer_idx: int, out_proj: nn.Module) -> nn.Module:
        from scalelab.models.budget_layers import BudgetAttention

        return BudgetAttention(model, layer_idx, out_proj, self.settings(model))
