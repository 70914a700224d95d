"""IsoFLOP profiles (Hoffmann et al. 2022, Approach 2).

For each compute budget C, final loss is fitted as a parabola in log N; its vertex is the
compute-optimal size N_opt(C). Power laws through the vertices give N_opt = k_N C^a and
D_opt = k_D C^b. D_opt at a budget is read from the trials' own tokens (interpolated in
log N at the vertex) when given, else taken as C / (6 N_opt).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from .data import ScalingError, ScalingWarning, clean, require_distinct

_WHAT = "IsoFLOP fit (Approach 2)"


@dataclass(frozen=True)
class BudgetOptimum:
    """Vertex of one budget's parabola L = c2 (log N)^2 + c1 log N + c0."""

    flops: float
    n_opt: float
    d_opt: float
    loss_opt: float
    curvature: float  # c2 > 0
    interior: bool  # vertex inside the sampled N range (else it is an extrapolation)
    n_trials: int


@dataclass(frozen=True)
class IsoFlopFit:
    """N_opt(C) = k_n C^a and D_opt(C) = k_d C^b through the per-budget optima."""

    budgets: tuple[BudgetOptimum, ...]
    a: float
    k_n: float
    b: float
    k_d: float

    def optimal(self, flops: np.ndarray | float) -> tuple[np.ndarray, np.ndarray]:
        c = np.asarray(flops, dtype=float)
        return self.k_n * c**self.a, self.k_d * c**self.b

    def values(self) -> dict[str, float]:
        out = {"a": self.a, "b": self.b, "k_n": self.k_n, "k_d": self.k_d}
        for opt in self.budgets:
            out[f"N_opt@{opt.flops:.3g}"] = opt.n_opt
            out[f"D_opt@{opt.flops:.3g}"] = opt.d_opt
            out[f"loss_opt@{opt.flops:.3g}"] = opt.loss_opt
        return out


def fit_isoflop(
    budget: np.ndarray,
    n_params: np.ndarray,
    loss: np.ndarray,
    *,
    tokens: np.ndarray | None = None,
) -> IsoFlopFit:
    """Parabola in log N per budget, then power laws through the vertices.

    `budget` is each trial's nominal compute budget (trials sharing a value form one
    IsoFLOP profile). Needs >= 2 budgets with >= 3 distinct sizes each, and a parabola
    that opens upwards at every budget."""
    covariates = {"budget": budget, "n_params": n_params}
    if tokens is not None:
        covariates["tokens"] = tokens
    y, xs = clean(loss, covariates, what=_WHAT)
    require_distinct(xs["budget"], 2, what=_WHAT, name="compute budgets")
    optima = []
    for c in np.unique(xs["budget"]):
        rows = xs["budget"] == c
        log_n = np.log(xs["n_params"][rows])
        what = f"{_WHAT} at budget C={c:.3g}"
        require_distinct(log_n, 3, what=what, name="model sizes")
        c2, c1, c0 = np.polyfit(log_n, y[rows], 2)
        if not c2 > 0:
            raise ScalingError(
                f"{what}: loss versus log N does not curve upwards (no minimum); add sizes "
                "on both sides of the optimum"
            )
        log_n_opt = -c1 / (2 * c2)
        interior = bool(log_n.min() <= log_n_opt <= log_n.max())
        if not interior:
            warnings.warn(
                f"{what}: the optimum N={np.exp(log_n_opt):.3g} lies outside the sampled "
                f"sizes [{np.exp(log_n.min()):.3g}, {np.exp(log_n.max()):.3g}] (extrapolated)",
                ScalingWarning,
                stacklevel=2,
            )
        if tokens is None:
            d_opt = c / (6.0 * np.exp(log_n_opt))
        else:
            slope, icept = np.polyfit(log_n, np.log(xs["tokens"][rows]), 1)
            d_opt = np.exp(icept + slope * log_n_opt)
        optima.append(
            BudgetOptimum(
                flops=float(c),
                n_opt=float(np.exp(log_n_opt)),
                d_opt=float(d_opt),
                loss_opt=float(c0 - c1 * c1 / (4 * c2)),
                curvature=float(c2),
                interior=interior,
                n_trials=int(rows.sum()),
            )
        )
    log_c = np.log([o.flops for o in optima])
    a, log_k_n = np.polyfit(log_c, np.log([o.n_opt for o in optima]), 1)
    b, log_k_d = np.polyfit(log_c, np.log([o.d_opt for o in optima]), 1)
    return IsoFlopFit(
        budgets=tuple(optima),
        a=float(a),
        k_n=float(np.exp(log_k_n)),
        b=float(b),
        k_d=float(np.exp(log_k_d)),
    )


def bin_budgets(flops: np.ndarray, width: float = 0.1) -> np.ndarray:
    """Each trial's IsoFLOP budget from its real FLOPs (runs that aimed at one budget land
    a few per cent apart): in increasing FLOPs, a bin opens at the smallest FLOPs not yet
    binned and takes every trial within `width` decades above it; a trial's budget is its
    bin's geometric mean. Bins of a fixed width in log C, placed where the data is, so
    a cluster of runs is never cut by a grid line that falls inside it."""
    if not (np.isfinite(width) and width > 0):
        raise ScalingError(f"{_WHAT}: the bin width must be a positive number of decades")
    c = np.asarray(flops, dtype=float)
    out = np.full(c.shape, np.nan)
    ok = np.flatnonzero(np.isfinite(c) & (c > 0))
    log_c = np.log10(c[ok])
    order = np.argsort(log_c, kind="stable")
    start = 0
    while start < order.size:
        stop = start
        while stop < order.size and log_c[order[stop]] - log_c[order[start]] <= width:
            stop += 1
        members = ok[order[start:stop]]
        out[members] = 10 ** log_c[order[start:stop]].mean()
        start = stop
    return out
