"""Loss versus compute: the Pareto frontier and L(C) = E + A * C^(-alpha).

Symbols: C training FLOPs, L loss, E irreducible loss, A scale, alpha the compute exponent.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .data import ScalingError, clean, require_distinct
from .objective import LogLaw, centre, minimise, on_lower_bound_E, uncentre

_WHAT = "power-law fit L(C) = E + A*C^-alpha"
_NO_E = "L(C) = A*C^-alpha"


@dataclass(frozen=True)
class PowerLawFit:
    """L(C) = E + A * C^(-alpha), fitted on `n_trials` trials; E = 0 and has_E False when
    the full law was degenerate and the simpler A * C^(-alpha) was fitted (`fallback` says
    why)."""

    E: float
    A: float
    alpha: float
    n_trials: int
    has_E: bool = True
    fallback: str = ""

    @property
    def form(self) -> str:
        return "E + A·C^-alpha" if self.has_E else "A·C^-alpha (no E)"

    def predict(self, flops: np.ndarray | float) -> np.ndarray:
        return self.E + self.A * np.asarray(flops, dtype=float) ** -self.alpha

    def flops_at(self, loss: np.ndarray | float) -> np.ndarray:
        """Compute C at which the law reaches `loss`; inf where loss <= E (never reached)."""
        gap = np.asarray(loss, dtype=float) - self.E
        with np.errstate(divide="ignore", invalid="ignore"):
            log_c = (np.log(self.A) - np.log(gap)) / self.alpha
        return np.where(gap > 0, np.exp(log_c), np.inf)

    def values(self) -> dict[str, float]:
        return {"E": self.E, "A": self.A, "alpha": self.alpha}


def pareto_frontier(flops: np.ndarray, loss: np.ndarray) -> np.ndarray:
    """Indices of the lower-left frontier (no other trial has less-or-equal compute and a
    lower loss), sorted by compute. Trials with NaN loss are never on it."""
    c = np.asarray(flops, dtype=float)
    y = np.asarray(loss, dtype=float)
    if c.shape != y.shape:
        raise ScalingError(f"pareto_frontier: {c.size} flops but {y.size} losses")
    ok = np.flatnonzero(np.isfinite(c) & np.isfinite(y))
    if ok.size == 0:
        raise ScalingError("pareto_frontier: no trial with finite compute and loss")
    order = ok[np.lexsort((y[ok], c[ok]))]  # by compute, ties: lowest loss first
    best_before = np.minimum.accumulate(np.concatenate([[np.inf], y[order][:-1]]))
    return order[y[order] < best_before]


def power_law_starts(log_c: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Grid of (e, a, alpha) starts: E over fractions of the lowest loss, alpha over a
    log grid, and a profiled out by least squares of log(L - E) + alpha * log C."""
    loss = np.exp(y)
    rows = []
    for frac in (1e-3, 0.2, 0.4, 0.6, 0.75, 0.85, 0.92, 0.97):
        E = frac * loss.min()
        gap = np.log(loss - E)
        for alpha in np.geomspace(0.01, 2.0, 16):
            rows.append((np.log(E), np.mean(gap + alpha * log_c), alpha))
    return np.array(rows)


def fit_power_law(
    flops: np.ndarray,
    loss: np.ndarray,
    *,
    start: PowerLawFit | None = None,
    with_E: bool | None = None,
) -> PowerLawFit:
    """Fit L(C) = E + A*C^-alpha (Huber in log space, L-BFGS-B from a grid of starts, or
    from `start` alone, as bootstrap resamples do). Needs >= 3 distinct compute values
    and >= 4 trials.

    with_E=None (default) falls back to L = A*C^-alpha when E falls to its bound 0 (the
    points show no flattening towards an irreducible loss) and says so in `fallback`; a
    `start` without E keeps its form, so bootstrap resamples refit the same law."""
    y, xs = clean(loss, {"flops": flops}, what=_WHAT)
    c = xs["flops"]
    require_distinct(c, 3, what=_WHAT, name="compute values (model sizes)")
    if y.size < 4:
        raise ScalingError(f"{_WHAT}: needs at least 4 trials for 3 constants; got {y.size}")
    auto = with_E is None and start is None
    if start is not None and with_E is None:
        with_E = start.has_E
    log_c = np.log(c)
    shift = np.array([log_c.mean()])
    if with_E is not False:
        law = LogLaw(X=(log_c - shift)[:, None], y=np.log(y))
        if start is None:
            starts = power_law_starts(log_c, law.y)
        else:
            starts = np.array([[np.log(max(start.E, 1e-300)), np.log(start.A), start.alpha]])
        theta, _ = minimise(law, centre(starts, shift))
        e, a, alpha = uncentre(theta, shift)
        E = float(np.exp(e))
        if not auto or not on_lower_bound_E(E, y):
            return PowerLawFit(E=E, A=float(np.exp(a)), alpha=float(alpha), n_trials=y.size)
    if auto:
        why = f"E fell to its bound 0 (no flattening towards an irreducible loss): fitted {_NO_E}"
    else:  # asked for without E, or a bootstrap resample of a fit without E
        why = start.fallback if start is not None else ""
    a, alpha = _fit_without_E(log_c, np.log(y), shift, start)
    return PowerLawFit(0.0, a, alpha, y.size, has_E=False, fallback=why)


def _fit_without_E(
    log_c: np.ndarray, log_y: np.ndarray, shift: np.ndarray, start: PowerLawFit | None
) -> tuple[float, float]:
    """A, alpha of L = A C^-alpha: Huber regression of log L on log C, from least squares
    (or `start`)."""
    law = LogLaw(X=(log_c - shift)[:, None], y=log_y, has_E=False)
    if start is None:
        slope, intercept = np.polyfit(log_c, log_y, 1)
        starts = np.array([[intercept, max(-slope, 0.0)], [intercept, 0.1]])
    else:
        starts = np.array([[np.log(start.A), start.alpha]])
    theta, _ = minimise(law, centre(starts, shift))
    a, alpha = uncentre(theta, shift)
    return float(np.exp(a)), float(alpha)
