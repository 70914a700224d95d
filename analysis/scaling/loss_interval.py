"""Forecast the final loss of a run that was not made, with a prediction interval.

The law: Chinchilla's L(N, D) when the trials span at least 3 sizes and 3 token counts
(and 7 trials, so one degree of freedom is left), else L(C) through the cells.

L(N, D) is the Huber fit `fit_chinchilla`, the same estimator and the same points as
`results fit` (one law per question), with its delta-method covariance and an interval
widened by the misfit its leave-one-size-out backtests measure on the ladder itself and,
beyond the data, by the error its forward-chaining backtests made at the same distance
(robust.py): half-width sqrt(max(parameter, extrapolation)^2 + scatter^2 + misfit^2) in
log L, each part reported (docs/scaling.md, "Forecast": 17 of the real Chinchilla
ladder's 18 runs above 5B covered from those below). On synthetic ladders drawn from the law plus a smooth 1% drift with N and off-law
runs at small D/N, the 95% interval covers a held-out largest size's runs in 96% of 200
ladders (94% without the misfit term); on exact-law ladders in 95-97%
(tests/orchestrator/test_forecast_nd.py).

L(C) is a least-squares fit (lsq.py), as in `results fit`, and gives, for a new run, the
prediction interval

    log L_hat +- t(n - p) * sqrt(se(log L_hat)^2 + sigma^2)

(the law's uncertainty at the target plus one run's scatter about the law). Fewer than 5
points leave a law with E too few degrees of freedom (t(1) = 12.7): the law without E is
used alone, and says so. Otherwise a few small
sizes rarely show whether the loss has started to flatten towards E: the law without E
predicts a lower loss at scale than the law with it, and the data cannot choose. The
interval is therefore the envelope of both laws' intervals (when the fit with E fell back
to the law without E, they are the same law). On synthetic ladders like the demo this
envelope covers the held-out run in 97% of draws, where the law with E's own interval
covers 93% and the law without E's 91% (tests/orchestrator/test_answers.py).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from .checks import FitCheck, check_chinchilla, check_power_law
from .data import ScalingError, clean
from .lsq import LsqFit, lsq_power_law
from .robust import RobustLaw, Spread, robust_law

_MIN_POINTS_FOR_E = 5  # 3 constants + 2 degrees of freedom, else the t quantile explodes


@dataclass(frozen=True)
class Prediction:
    loss: float
    low: float
    high: float
    level: float
    spread: Spread | None = None  # L(N, D): the interval's parts, in log L (robust.py)

    def __contains__(self, value: float) -> bool:
        return bool(self.low <= value <= self.high)


@dataclass(frozen=True, eq=False)
class ForecastLaw:
    """The law a forecast extrapolates, with and without E (module doc)."""

    name: str  # "L(C)" or "L(N, D)"
    law: LsqFit | RobustLaw  # with E, unless E fell to 0 (law.fallback says so)
    plain: LsqFit | None  # L(C) without E (None for L(N, D))
    check: FitCheck

    @property
    def covariates(self) -> tuple[str, ...]:
        return self.law.covariates

    def predict(self, *covariates: np.ndarray | float, level: float = 0.95) -> list[Prediction]:
        """One prediction per target: (C,) or (N, D) arrays, as the law's covariates."""
        if isinstance(self.law, RobustLaw):
            est, low, high, spreads = self.law.prediction(*covariates, level=level)
            return [Prediction(float(e), float(lo), float(hi), level, s) for e, lo, hi, s in
                    zip(est, low, high, spreads, strict=True)]  # fmt: skip
        assert self.plain is not None
        est, low, high = self.law.prediction_interval(*covariates, level=level)
        _, low2, high2 = self.plain.prediction_interval(*covariates, level=level)
        low, high = np.fmin(low, low2), np.fmax(high, high2)
        return [Prediction(float(e), float(lo), float(hi), level) for e, lo, hi in
                zip(est, low, high, strict=True)]  # fmt: skip


def fit_forecast_law(
    n_params: np.ndarray, tokens: np.ndarray, flops: np.ndarray, loss: np.ndarray,
    *, law: str = "auto", level: float = 0.95, labels: list[str] | None = None,
) -> ForecastLaw:  # fmt: skip
    """The forecast's law (module doc) through these points: `law` is "auto", "C" (L(C))
    or "ND" (Chinchilla's L(N, D), calibrated at `level`); `labels` name the points in
    the check's list of outliers."""
    y, xs = clean(loss, {"n_params": n_params, "tokens": tokens, "flops": flops},
                  what="forecast")  # fmt: skip
    n, d, c = xs["n_params"], xs["tokens"], xs["flops"]
    cells = np.unique(np.column_stack([n, d]), axis=0).shape[0]
    rich = np.unique(n).size >= 3 and np.unique(d).size >= 3 and cells >= 7
    if law == "ND" or (law == "auto" and rich):
        if not rich:
            raise ScalingError(
                "forecast with L(N, D): needs 3 or more sizes and token counts and 7 trials"
            )
        first = robust_law(n, d, y, level=level)
        check = check_chinchilla(first, n, d, y, labels=labels)
        if check.outliers:  # scored without them: they are not like the run forecast
            off = check.outlier_mask(y.size)
            first = robust_law(n, d, y, level=level, fit=first.fit, exclude=off)
        return ForecastLaw("L(N, D)", first, None, check)
    if law not in ("auto", "C", "ND"):
        raise ScalingError(f"forecast: law must be auto, C or ND, got {law!r}")
    plain = lsq_power_law(c, y, with_E=False)
    if y.size < _MIN_POINTS_FOR_E:
        full = replace(plain, fallback=(
            f"{y.size} points leave a law with E fewer than 2 degrees of freedom: fitted "
            "the law without E, whose forecast is the lowest a flattening law would give"
        ))  # fmt: skip
    else:
        full = lsq_power_law(c, y)
    return ForecastLaw("L(C)", full, plain, check_power_law(full, c, y))
