"""Per-size comparison: each variant against the baseline at the same named size."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

from .data import ScalingError, ScalingWarning, column


@dataclass(frozen=True)
class SizeComparison:
    """Means over seeds at one size; differences are variant minus baseline."""

    size: str
    variant: str
    baseline: str
    loss: float
    baseline_loss: float
    n_params: float
    baseline_n_params: float
    flops: float
    baseline_flops: float
    n_trials: int
    baseline_n_trials: int

    @property
    def loss_diff(self) -> float:
        return self.loss - self.baseline_loss

    @property
    def params_diff(self) -> float:
        return self.n_params - self.baseline_n_params

    @property
    def params_ratio(self) -> float:
        return self.n_params / self.baseline_n_params

    @property
    def flops_diff(self) -> float:
        return self.flops - self.baseline_flops

    @property
    def flops_ratio(self) -> float:
        return self.flops / self.baseline_flops


def compare_sizes(
    table: Any,
    *,
    baseline: str = "dense",
    loss: str = "final_loss",
    size_column: str = "size",
    variant_column: str = "variant",
    params_column: str = "n_params",
    flops_column: str = "flops",
) -> list[SizeComparison]:
    """One row per (variant, size) that the baseline also ran. Trials with a NaN loss are
    dropped and (variant, size) pairs without a baseline are skipped, each with a
    `ScalingWarning`; no pair at all raises `ScalingError`."""
    variant = column(table, variant_column).astype(str)
    size = column(table, size_column).astype(str)
    y = column(table, loss).astype(float)
    n = column(table, params_column).astype(float)
    c = column(table, flops_column).astype(float)
    if y.size == 0:
        raise ScalingError("compare_sizes: the results table is empty")
    if baseline not in set(variant):
        raise ScalingError(
            f"compare_sizes: no baseline: variant {baseline!r} has no trials "
            f"(variants present: {sorted(set(variant))})"
        )
    bad = ~np.isfinite(y)
    if bad.any():
        warnings.warn(
            f"compare_sizes: dropped {int(bad.sum())} of {y.size} trials with NaN/inf loss",
            ScalingWarning,
            stacklevel=2,
        )
    groups: dict[tuple[str, str], np.ndarray] = {}
    for key in sorted(set(zip(variant[~bad], size[~bad], strict=True))):
        groups[key] = np.flatnonzero((variant == key[0]) & (size == key[1]) & ~bad)
    rows, missing = [], []
    for (v, s), idx in groups.items():
        if v == baseline:
            continue
        base = groups.get((baseline, s))
        if base is None:
            missing.append(f"{v}@{s}")
            continue
        rows.append(
            SizeComparison(
                size=s,
                variant=v,
                baseline=baseline,
                loss=float(y[idx].mean()),
                baseline_loss=float(y[base].mean()),
                n_params=float(n[idx].mean()),
                baseline_n_params=float(n[base].mean()),
                flops=float(c[idx].mean()),
                baseline_flops=float(c[base].mean()),
                n_trials=idx.size,
                baseline_n_trials=base.size,
            )
        )
    if missing:
        warnings.warn(
            f"compare_sizes: no finished {baseline!r} trial at the size of {', '.join(missing)}",
            ScalingWarning,
            stacklevel=2,
        )
    if not rows:
        raise ScalingError(
            f"compare_sizes: no size has both {baseline!r} and another variant finished"
        )
    return rows
