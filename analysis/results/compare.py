"""Any per-trial metric of a sweep (a downstream accuracy `eval_piqa_acc`, a loss) compared
with the baseline variant: per cell (every swept axis but the variant and the seed; means
over seeds, the mean paired difference with its standard error) and over the whole sweep
(the mean of the paired differences of trials that share a cell and a seed, with a
Student-t interval). The scaling-law fits (`results fit`) need a loss; this needs none of
their assumptions, so it is how a downstream claim ("matches or slightly beats dense") is
read (docs/evaluation.md, 'In the results').
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .store import ResultsError
from .usable import usable_trials

if TYPE_CHECKING:
    import pyarrow as pa

    from scalelab.analysis.scaling.cells import CellComparison


@dataclass(frozen=True)
class PairedDifference:
    """variant - baseline over the trials that share a cell and a seed."""

    variant: str
    baseline: str
    mean: float
    low: float  # NaN with fewer than two pairs
    high: float
    level: float
    n_pairs: int
    n_cells: int


@dataclass
class MetricComparison:
    sweep: str
    metric: str
    baseline: str
    level: float
    axes: list[str]
    cells: list[CellComparison]
    overall: list[PairedDifference]
    notes: list[str] = field(default_factory=list)


def compare_sweep(
    sweep: str,
    metric: str,
    *,
    baseline: str = "dense",
    where: str | None = None,
    level: float = 0.95,
    root: Path | None = None,
) -> MetricComparison:
    """`metric` (a column of the synced trials table) of every variant against `baseline`."""
    from .query import trials_where

    table = trials_where(sweep, where, root)
    return compare_table(table, sweep, metric, baseline=baseline, level=level)


def compare_table(
    table: pa.Table, sweep: str, metric: str, *, baseline: str = "dense", level: float = 0.95
) -> MetricComparison:
    from scalelab.analysis.scaling import ScalingError, ScalingWarning
    from scalelab.analysis.scaling.cells import compare_cells, pair_trials

    from .design import read_design

    if metric not in table.column_names:
        evals = sorted(c for c in table.column_names if c.startswith("eval_"))
        known = ", ".join(evals) or "none: `scalelab eval` the trials, then `results sync`"
        raise ResultsError(f"unknown metric column {metric!r} (downstream columns: {known})")
    notes: list[str] = []
    used = usable_trials(table, metric, notes)
    variants = sorted(set(used["variant"].to_pylist()) - {baseline})
    if baseline not in set(used["variant"].to_pylist()):
        raise ResultsError(
            f"no baseline: variant {baseline!r} has no finished trial with {metric} in sweep "
            f"{sweep!r}; choose one with --baseline"
        )
    design = read_design(used)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            cells = compare_cells(
                design.table, baseline=baseline, loss=metric, axes=design.axes, arms=design.arms
            )
        except ScalingError as e:
            raise ResultsError(str(e)) from None
        overall = []
        for v in variants:
            try:
                pairs = pair_trials(design.table, v, baseline, loss=metric, axes=design.axes)
            except ScalingError as e:
                notes.append(str(e))
                continue
            overall.append(_paired(v, baseline, pairs.loss - pairs.baseline_loss, pairs, level))
    notes += [str(w.message) for w in caught if issubclass(w.category, ScalingWarning)]
    return MetricComparison(sweep, metric, baseline, level, design.axes, cells, overall, notes)


def _paired(
    variant: str, baseline: str, d: np.ndarray, pairs: Any, level: float
) -> PairedDifference:
    from scipy import stats

    n = int(d.size)
    mean = float(d.mean())
    if n < 2:
        low = high = math.nan
    else:
        half = float(stats.t.ppf(0.5 + level / 2, n - 1) * d.std(ddof=1) / math.sqrt(n))
        low, high = mean - half, mean + half
    return PairedDifference(variant, baseline, mean, low, high, level, n, len(set(pairs.cells)))
