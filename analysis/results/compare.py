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
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .tables import ResultsError
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


@dataclass(frozen=True)
class ItemNoise:
    """How much a downstream accuracy moves for want of items: the task's chance level
    (None when unknown), its items per trial (from lm-eval's binomial standard error,
    n = p(1 - p) / se² + 1; None without one) and that standard error (the median over
    trials), the mean accuracy, and a one-line warning when a trial's item noise exceeds
    the paired interval's half-width or the mean accuracy sits within two of a trial's
    standard errors (without one, two standard deviations over trials) of chance."""

    task: str
    chance: float | None
    items: int | None
    trial_se: float | None
    mean: float
    warning: str | None = None


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
    noise: ItemNoise | None = None  # a downstream accuracy only


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
    noise = item_noise(used, metric, overall)
    return MetricComparison(
        sweep, metric, baseline, level, design.axes, cells, overall, notes, noise
    )


ACCURACY = re.compile(r"^eval_(?P<task>.+?)_(?P<kind>acc_norm|acc)$")
NEAR_CHANCE_SE = 2.0  # a mean accuracy within 2 of a trial's standard errors of chance


def items_from_stderr(acc: np.ndarray, stderr: np.ndarray) -> np.ndarray:
    """Items behind each accuracy, from lm-eval's standard error of a mean of 0/1 scores
    (sample standard deviation over sqrt(n): se² = p(1 - p) / (n - 1)); NaN where it does
    not say (no error, p at 0 or 1)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        n = acc * (1 - acc) / stderr**2 + 1
    ok = np.isfinite(n) & (stderr > 0) & (acc > 0) & (acc < 1)
    return np.where(ok, np.round(n), np.nan)


def item_noise(table: pa.Table, metric: str, overall: list[PairedDifference]) -> ItemNoise | None:
    """ItemNoise of a downstream accuracy column `eval_<task>_acc[_norm]` (None for any
    other metric), read from its `_stderr` column beside it when the trials have one."""
    from scalelab.analysis.scaling.task_laws import CHANCE

    match = ACCURACY.match(metric)
    if match is None:
        return None
    task = match["task"]
    acc = table[metric].to_numpy(zero_copy_only=False).astype(float)
    chance = CHANCE.get(task)
    items = trial_se = None
    if f"{metric}_stderr" in table.column_names:
        stderr = table[f"{metric}_stderr"].to_numpy(zero_copy_only=False).astype(float)
        n = items_from_stderr(acc, stderr)
        if np.isfinite(n).any():
            items = int(np.nanmedian(n))
            trial_se = float(np.nanmedian(np.where(np.isfinite(n), stderr, np.nan)))
    mean = float(np.nanmean(acc))
    said = []
    if trial_se is not None:
        wide = [p for p in overall if math.isfinite(p.high) and trial_se > (p.high - p.low) / 2]
        if wide:
            half = max((p.high - p.low) / 2 for p in wide)
            said.append(
                f"with {items} items a trial's accuracy has a binomial standard error of "
                f"{trial_se:.3f}, more than the {wide[0].level:.0%} interval's half-width "
                f"({half:.3f}): item noise, not the variants, may make the difference"
            )
    if chance is not None:
        # without a standard error: the trials' own scatter stands in for it
        spread = trial_se if trial_se is not None else float(np.nanstd(acc, ddof=1))
        near = NEAR_CHANCE_SE * spread if np.isfinite(spread) else 0.0
        if abs(mean - chance) <= near:
            said.append(f"the accuracies (mean {mean:.3f}) sit at chance ({chance:g})")
    warning = None
    if said:
        warning = (
            "; ".join(said) + ": score more items (a larger `scalelab eval --limit`, or none: all)"
        )
    return ItemNoise(task, chance, items, trial_se, mean, warning)


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
