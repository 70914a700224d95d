"""The `tune:` section of a sweep file (docs/sweep-yaml.md, "Tuning the learning rate")."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from scalelab.contract.config import FrozenConfig
from scalelab.orchestrator.plan.axis_keys import AxisKey, AxisValues


class TuneSpec(FrozenConfig):
    """`tune:`, a stage before the sweep's own trials: every variant trained at each
    learning rate of `lr` where `at` says (a small width), its optimum picked from a
    parabola in log-rate (orchestrator/plan/lr_optimum.py), and the sweep's trials run at
    each variant's own optimum (docs/sweep-yaml.md, "Tuning the learning rate")."""

    lr: list[Annotated[float, Field(gt=0)]] = Field(
        min_length=3, description="the rates the search trains, e.g. [1e-3, 2e-3, 4e-3, 8e-3]"
    )
    at: dict[AxisKey, AxisValues] = Field(
        default_factory=dict,
        description="what the search trials set instead of the sweep's axes, e.g. "
        "{model.size: [nano]}; every other key is base's",
    )
    baseline: str = Field("dense", description="the variant the others are compared with")
    compare_at_baseline_rate: bool = Field(
        True,
        description="also train every other variant at the baseline's tuned rate, so the "
        "gain is reported at both rates",
    )

    method: Literal["grid", "halving"] = Field(
        "grid",
        description="grid: every rate trained to the search's budget; halving: successive "
        "halving, every rate trained to a fraction of it and only the best half (at least 3 "
        "rates, around the best) carried on to the next rung, from where the last stopped "
        "(orchestrator/plan/halving.py)",
    )
    rungs: int = Field(
        3, ge=2, le=6,
        description="method halving: how many budgets, each twice the last and the last the "
        "search's train.tokens",
    )  # fmt: skip

    @model_validator(mode="after")
    def _halving_narrows(self) -> TuneSpec:
        if self.method == "halving" and len(self.lr) < 4:
            raise ValueError(
                f"method halving keeps 3 rates at its last rung: give tune.lr at least 4 rates "
                f"(got {len(self.lr)}), or use method grid"
            )
        if self.method == "grid" and "rungs" in self.model_fields_set:
            raise ValueError("tune.rungs is method halving's: set method: halving or drop it")
        return self

    @field_validator("lr")
    @classmethod
    def _distinct_rates(cls, rates: list[float]) -> list[float]:
        if len(set(rates)) != len(rates):
            raise ValueError(f"rates are repeated: {rates}")
        return sorted(rates)

    @field_validator("at")
    @classmethod
    def _at_has_values(cls, axes: dict[str, list[Any]]) -> dict[str, list[Any]]:
        for key, values in axes.items():
            if not values:
                raise ValueError(f"{key}: needs at least one value")
            if key == "train.lr":
                raise ValueError("train.lr: the search's rates are tune.lr")
        return axes
