"""Bootstrap over trials: resample rows with replacement, refit, percentile intervals.

Every fit result exposes `values() -> dict[str, float]` (its constants and derived numbers),
so one routine gives intervals for all of them. Resamples warm-start from the point
estimate (`start=`) instead of searching the full grid again. `linearised_bootstrap` is
the same resampling for a Huber fit of many rows, each resample a count per row and its
refit the law linearised at the point fit (refine.Linearised; docs/scaling.md, "At
scale").
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import numpy as np

from .data import ScalingError, ScalingWarning
from .objective import single_threaded_blas
from .refine import BATCH_ROWS, Linearised

F = TypeVar("F")
# Up to this many rows the Huber fits' bootstraps refit the law itself per resample;
# beyond, the law linearised at the point fit (`linearised_bootstrap`; docs/scaling.md,
# "At scale": per resample within ~3% of the spread at 500 rows, 1% at 2,500).
EXACT_ROWS = 1000


@dataclass(frozen=True)
class Interval:
    """Point estimate and percentile bootstrap interval at `level` (e.g. 0.95)."""

    estimate: float
    low: float
    high: float
    level: float

    def __contains__(self, value: float) -> bool:
        return bool(self.low <= value <= self.high)

    def __str__(self) -> str:
        return f"{self.estimate:.4g} [{self.low:.4g}, {self.high:.4g}]"


@dataclass(frozen=True)
class Bootstrap(Generic[F]):
    """A point fit with intervals for each of its `values()` (and any derived numbers)."""

    point: F
    intervals: Mapping[str, Interval]
    samples: Mapping[str, np.ndarray]  # name -> values over the successful resamples
    n_resamples: int
    n_failed: int  # resamples whose refit raised ScalingError or gave NaN (degenerate draws)
    level: float
    seed: int

    def __getitem__(self, name: str) -> Interval:
        return self.intervals[name]

    def __str__(self) -> str:
        head = (
            f"{type(self.point).__name__}: {self.level:.0%} bootstrap intervals, "
            f"{self.n_resamples - self.n_failed}/{self.n_resamples} resamples"
        )
        return "\n".join([head] + [f"  {k:>14} = {v}" for k, v in self.intervals.items()])


def percentile_interval(samples: np.ndarray, estimate: float, level: float) -> Interval:
    q = [(1 - level) / 2, (1 + level) / 2]
    low, high = np.quantile(samples, q)
    if np.isnan(low) or np.isnan(high):  # interpolating between infs ("never reached")
        low, high = np.quantile(samples, q, method="nearest")
    return Interval(float(estimate), float(low), float(high), level)


def resample_indices(
    n: int, n_resamples: int, rng: np.random.Generator, strata: np.ndarray | None = None
) -> np.ndarray:
    """(n_resamples, n) row indices drawn with replacement, within each stratum if given
    (so every variant or budget keeps its number of trials)."""
    if strata is None:
        return rng.integers(0, n, size=(n_resamples, n))
    out = np.empty((n_resamples, n), dtype=np.intp)
    for label in np.unique(strata):
        rows = np.flatnonzero(strata == label)
        out[:, rows] = rows[rng.integers(0, rows.size, size=(n_resamples, rows.size))]
    return out


def bootstrap(
    fit: Callable[..., F],
    *arrays: Any,
    n_resamples: int = 1000,
    level: float = 0.95,
    seed: int = 0,
    strata: Any = None,
    derive: Callable[[F], Mapping[str, float]] | None = None,
    max_failed: float = 0.05,
    **columns: Any,
) -> Bootstrap[F]:
    """`fit(*arrays, **columns)` on the data, then on `n_resamples` resamples of its rows.

    Positional arrays and keyword columns (None passes through) are resampled together;
    bind other options with functools.partial. `strata` (one label per row) resamples
    within groups. Rows with a non-finite value are left out of resampling (the point fit
    reports them). More than `max_failed` failed refits raise `ScalingError`.
    """
    _check_options(n_resamples, level)
    point = fit(*arrays, **columns)
    names = [k for k, v in columns.items() if v is not None]
    data = [np.asarray(a) for a in arrays] + [np.asarray(columns[k]) for k in names]
    n = data[0].shape[0]
    if any(d.shape[0] != n for d in data):
        raise ScalingError("bootstrap: all data columns must have the same length")
    keep = np.ones(n, dtype=bool)
    for d in data:
        if np.issubdtype(d.dtype, np.number):
            keep &= np.isfinite(d)
    data = [d[keep] for d in data]
    labels = None if strata is None else np.asarray(strata)[keep]
    warm = "start" in inspect.signature(fit).parameters

    def values(result: F) -> dict[str, float]:
        out = dict(result.values())  # type: ignore[attr-defined]
        if derive is not None:
            out.update(derive(result))
        return out

    estimate = values(point)
    rows = resample_indices(int(keep.sum()), n_resamples, np.random.default_rng(seed), labels)
    draws: list[dict[str, float]] = []
    errors: list[str] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ScalingWarning)
        for idx in rows:
            args = [d[idx] for d in data]
            kwargs = dict(zip(names, args[len(arrays) :], strict=True))
            if warm:
                kwargs["start"] = point
            try:
                draw = values(fit(*args[: len(arrays)], **kwargs))
            except ScalingError as err:
                errors.append(str(err))
                continue
            undefined = sorted(k for k, v in draw.items() if np.isnan(v))
            if undefined:  # e.g. a degenerate refit: count it as failed, never average it in
                errors.append(f"resampled fit left {', '.join(undefined)} undefined (NaN)")
            else:
                draws.append(draw)
    return _collect(point, estimate, draws, errors, n_resamples, level, seed, max_failed)


def _collect(
    point: F, estimate: Mapping[str, float], draws: list[dict[str, float]], errors: list[str],
    n_resamples: int, level: float, seed: int, max_failed: float,
) -> Bootstrap[F]:  # fmt: skip
    """The intervals over the successful draws; ScalingError when too many failed."""
    if len(errors) > max_failed * n_resamples:
        raise ScalingError(
            f"bootstrap: {len(errors)} of {n_resamples} resampled fits failed "
            f"(first: {errors[0]}); the data barely supports this fit"
        )
    samples = {k: np.array([d[k] for d in draws]) for k in estimate}
    intervals = {k: percentile_interval(samples[k], estimate[k], level) for k in estimate}
    return Bootstrap(
        point=point,
        intervals=intervals,
        samples=samples,
        n_resamples=n_resamples,
        n_failed=len(errors),
        level=level,
        seed=seed,
    )


def resample_counts(rows: np.ndarray, n: int) -> np.ndarray:
    """(B, n) how often each row was drawn, from (B, n) drawn row indices."""
    B = rows.shape[0]
    flat = (np.arange(B)[:, None] * n + rows).ravel()
    return np.bincount(flat, minlength=B * n).reshape(B, n).astype(float)


def linearised_bootstrap(
    point: F, law: Linearised, values: Callable[[np.ndarray], Mapping[str, float]], *,
    n_resamples: int = 1000, level: float = 0.95, seed: int = 0, strata: Any = None,
    max_failed: float = 0.05,
) -> Bootstrap[F]:  # fmt: skip
    """The bootstrap of a Huber fit at scale: the same resamples as `bootstrap` (row
    indices drawn with replacement, within strata), each refit as the Huber fit of the law
    linearised at `point` (refine.Linearised: a count per row, not a copy of the rows),
    `values(step)` the resampled fit's numbers for its step from the point fit. Resamples
    go a batch at a time (refine.BATCH_ROWS rows in all), so memory stays O(n) and not
    O(n_resamples x n). docs/scaling.md, "At scale"."""
    _check_options(n_resamples, level)
    n = law.r.size
    labels = None if strata is None else np.asarray(strata)
    rng = np.random.default_rng(seed)
    estimate = dict(point.values())  # type: ignore[attr-defined]
    draws: list[dict[str, float]] = []
    errors: list[str] = []
    per = max(1, BATCH_ROWS // n)
    steps = np.empty((n_resamples, law.jac.shape[1]))
    with single_threaded_blas():  # (B, n) x (n, 15) products: threads cost ~2x the CPU
        for lo in range(0, n_resamples, per):
            rows = resample_indices(n, min(per, n_resamples - lo), rng, labels)
            steps[lo : lo + per] = law.solve(resample_counts(rows, n))
    for step in steps:
        if not np.isfinite(step).all():
            errors.append("the resampled fit did not settle")
            continue
        draw = dict(values(step))
        undefined = sorted(k for k, v in draw.items() if np.isnan(v))
        if undefined:
            errors.append(f"resampled fit left {', '.join(undefined)} undefined (NaN)")
        else:
            draws.append(draw)
    return _collect(point, estimate, draws, errors, n_resamples, level, seed, max_failed)


def _check_options(n_resamples: int, level: float) -> None:
    if n_resamples < 1:
        raise ScalingError(f"bootstrap: n_resamples must be >= 1, got {n_resamples}")
    if not 0 < level < 1:
        raise ScalingError(f"bootstrap: level must be in (0, 1), got {level}")
