"""Compute-multiplier law: the variant's curve is the baseline's, shifted in compute.

    L_baseline(C) = E + A * C^-alpha,        L_variant(C) = L_baseline(C / m)

One E, one A, one alpha for both, plus the multiplier m: "the variant reaches any loss of
the baseline with m times the baseline's FLOPs". Four constants from both variants' trials
together, so small sweeps (a few sizes per variant) still give a usable interval, where
fitting each variant's own exponent does not. Fitted like every law here: Huber loss
(objective.HUBER_DELTA) of log-space residuals, L-BFGS-B from a small grid of starts.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import minimize

from .data import ScalingError
from .objective import HUBER_DELTA, _huber, single_threaded_blas
from .powerlaw import PowerLawFit

_ALPHAS = (0.05, 0.15, 0.4)
_E_FRACTIONS = (0.0, 0.5, 0.9)  # E as a share of the smallest loss seen


def fit_shift(
    flops: np.ndarray,
    loss: np.ndarray,
    is_variant: np.ndarray,
    start: tuple[float, float, float, float] | None = None,
) -> tuple[PowerLawFit, PowerLawFit, float]:
    """(baseline law, variant law, m) for trials of both variants (is_variant marks rows).
    `start` = (E, A, alpha, m) warm-starts a single descent (bootstrap resamples)."""
    x, y, v = np.log(flops), np.log(loss), np.asarray(is_variant, dtype=float)
    if np.unique(x[v == 0]).size < 2 or np.unique(x[v == 1]).size < 2:
        raise ScalingError(
            "compute-multiplier fit: each variant needs trials at 2 or more compute values"
        )
    shift = x.mean()

    def objective(theta: np.ndarray) -> tuple[float, np.ndarray]:
        return shift_objective(theta, x - shift, y, v)

    if start is not None:
        E, A, alpha, m = start
        starts = [np.array([np.log(max(E, 1e-12)), np.log(A) - alpha * shift, alpha, np.log(m)])]
    else:
        starts = []
        for frac in _E_FRACTIONS:
            E = frac * loss.min()
            for alpha in _ALPHAS:
                resid = np.log(np.maximum(loss - E, 1e-12)) + alpha * (x - shift)
                starts.append(np.array([np.log(max(E, 1e-12)), resid.mean(), alpha, 0.0]))
    bounds = [(None, float(y.min())), (None, None), (0.0, 10.0), (-20.0, 20.0)]
    with single_threaded_blas():
        best = min(
            (minimize(objective, s, jac=True, method="L-BFGS-B", bounds=bounds) for s in starts),
            key=lambda r: r.fun,
        )
    e, a, alpha, log_m = best.x
    if not np.all(np.isfinite(best.x)) or alpha <= 0:
        raise ScalingError("compute-multiplier fit did not converge (no positive exponent)")
    E, A = float(np.exp(e)), float(np.exp(a + alpha * shift))
    m = float(np.exp(log_m))
    n_b, n_v = int((v == 0).sum()), int((v == 1).sum())
    # L_variant(C) = E + A (C/m)^-alpha = E + (A m^alpha) C^-alpha
    return PowerLawFit(E, A, alpha, n_b), PowerLawFit(E, A * m**alpha, alpha, n_v), m


def shift_objective(
    theta: np.ndarray, x: np.ndarray, y: np.ndarray, v: np.ndarray
) -> tuple[float, np.ndarray]:
    """Huber loss of log L_hat - log L and its gradient; theta = [e, a, alpha, log m],
    log L_hat = LSE(e, a - alpha (x - v log m)), x = centred log C, v = 1 on variant rows."""
    e, a, alpha, log_m = theta
    u = x - v * log_m
    z = a - alpha * u
    pred = np.logaddexp(e, z)
    r = pred - y
    w0 = np.exp(e - pred)  # d pred / d e; 1 - w0 = d pred / d z
    g = np.clip(r, -HUBER_DELTA, HUBER_DELTA) / (HUBER_DELTA**2 * r.size)
    gz = g * (1.0 - w0)
    grad = np.array([g @ w0, gz.sum(), -(gz @ u), alpha * (gz @ v)])
    return float(_huber(r, HUBER_DELTA).mean() / HUBER_DELTA**2), grad
