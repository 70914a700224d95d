"""Each variant's optimum learning rate, from the tuning stage's grid of rates at a small width
(docs/sweep-yaml.md, "Tuning the learning rate").

The best grid point alone moves by a whole grid step on noise, so the rate is the vertex of a
parabola fitted to the loss in log-rate around the best point, with a delta-method interval.
The fit uses only the best point's neighbours: far from the optimum the loss is not a
parabola. What makes the choice unsafe is flagged rather than hidden: a best point at the
grid's edge (the optimum may lie beyond it: widen the grid), a fit without a vertex (the best
grid point is kept), and variants whose optima disagree (`transfer_holds`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class RateOptimum:
    rates: tuple[float, ...]  # the grid, ascending
    losses: tuple[float, ...]  # the metric at each rate (NaN or inf: diverged)
    rate: float  # the parabola's vertex when fitted, else the best grid point
    low: float  # interval of `rate` at `level`; nan without one
    high: float
    level: float
    fitted: bool  # True: vertex of a parabola in log-rate through `points` points
    points: int
    at_edge: bool  # the best finite point is the grid's smallest or largest rate

    def rate_text(self) -> str:
        if not self.fitted:
            return f"{self.rate:.1e} (best grid point)"
        if math.isnan(self.low):
            return f"{self.rate:.1e} (fit through {self.points} points, no interval)"
        if self.low < self.rates[0] or self.high > self.rates[-1]:
            return f"{self.rate:.1e} (its interval is wider than the grid: a flat or noisy bowl)"
        return f"{self.rate:.1e} [{self.low:.1e}, {self.high:.1e}]"

    @property
    def best_rate(self) -> float:
        """The grid's rate of lowest finite loss."""
        finite = [(loss, rate) for loss, rate in zip(self.losses, self.rates, strict=True)
                  if math.isfinite(loss)]  # fmt: skip
        return min(finite)[1]

    def step(self) -> float:
        """The grid's (median) step in log-rate."""
        import numpy as np

        return float(np.median(np.diff(np.log(self.rates))))

    def half_width(self) -> float:
        """Half the interval's width in log-rate; without an interval, half the grid's
        (median) step, since the rate is then known to about that."""
        if math.isfinite(self.low) and math.isfinite(self.high):
            return (math.log(self.high) - math.log(self.low)) / 2
        return self.step() / 2


def rate_optimum(
    rates: Sequence[float], losses: Sequence[float], *, level: float = 0.95, span: int = 2
) -> RateOptimum:
    """The optimum rate of one variant from its loss at each rate of the grid."""
    import numpy as np  # here: reading or planning a sweep imports no numpy (status, --help)

    if len(rates) != len(losses):
        raise ValueError(f"{len(rates)} rates but {len(losses)} losses")
    if len(rates) < 3:
        raise ValueError(f"at least 3 rates are needed to fit an optimum, got {len(rates)}")
    order = sorted(range(len(rates)), key=lambda i: rates[i])
    r = np.array([float(rates[i]) for i in order])
    y = np.array([float(losses[i]) for i in order])
    bad = [v for v in r if not (math.isfinite(v) and v > 0)]
    if bad:
        raise ValueError(f"rates must be positive and finite, got {bad}")
    repeated = sorted({float(a) for a, b in zip(r[:-1], r[1:], strict=True) if a == b})
    if repeated:
        raise ValueError(f"rates must be distinct, repeated: {repeated}")
    finite = np.flatnonzero(np.isfinite(y))
    if finite.size == 0:
        raise ValueError("every rate diverged")

    k = int(np.argmin(y[finite]))  # position among the finite points
    best = int(finite[k])
    used = finite[max(0, k - span) : k + span + 1]
    x, yu = np.log(r[used]), y[used]
    n = len(used)
    rate, low, high, fitted = float(r[best]), math.nan, math.nan, False
    if n >= 3:
        # Centred for conditioning; the vertex and its gradient are unchanged by the shift.
        x0 = float(x.mean())
        design = np.column_stack([np.ones(n), x - x0, (x - x0) ** 2])
        coef, *_ = np.linalg.lstsq(design, yu, rcond=None)
        _, b, c = (float(v) for v in coef)
        vertex = x0 - b / (2 * c) if c > 0 else math.nan
        if c > 0 and x.min() <= vertex <= x.max():
            fitted, rate = True, math.exp(vertex)
            if n > 3:
                rss = float(np.sum((yu - design @ coef) ** 2))
                cov = rss / (n - 3) * np.linalg.inv(design.T @ design)
                grad = np.array([0.0, -1 / (2 * c), b / (2 * c * c)])
                se = math.sqrt(max(float(grad @ cov @ grad), 0.0))
                from scipy import stats

                half = float(stats.t.ppf((1 + level) / 2, n - 3)) * se
                low, high = math.exp(vertex - half), math.exp(vertex + half)
    return RateOptimum(
        rates=tuple(float(v) for v in r),
        losses=tuple(float(v) for v in y),
        rate=rate,
        low=low,
        high=high,
        level=level,
        fitted=fitted,
        points=n,
        at_edge=best in (0, len(r) - 1),
    )


def transfer_holds(optima: Sequence[RateOptimum]) -> bool:
    """Whether the optima agree (one variant's at several widths): no two further apart in
    log-rate than the sum of their half-widths, and no two best grid points more than one
    grid step apart (a wide interval from a flat bowl hides no move the grid itself shows)."""
    for i, p in enumerate(optima):
        for q in optima[i + 1 :]:
            if abs(math.log(p.rate) - math.log(q.rate)) > p.half_width() + q.half_width():
                return False
            apart = abs(math.log(p.best_rate) - math.log(q.best_rate))
            if apart > 1.5 * max(p.step(), q.step()):
                return False
    return True


def rounded(rate: float, digits: int = 3) -> float:
    """`rate` to `digits` significant digits, so a trial's id (which contains its rate) stays
    the same when the fit is repeated on the same data."""
    return float(f"{rate:.{digits}g}")
