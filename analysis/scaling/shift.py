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
from .objective import HUBER_DELTA, huber, on_lower_bound_E, single_threaded_blas
from .powerlaw import PowerLawFit

_ALPHAS = (0.05, 0.15, 0.4)
_E_FRACTIONS = (0.0, 0.5, 0.9)  # E as a share of the smallest loss seen


def fit_shift(
    flops: np.ndarray,
    loss: np.ndarray,
    is_variant: np.ndarray,
    start: tuple[float, float, float, float] | None = None,
    with_E: bool | None = None,
) -> tuple[PowerLawFit, PowerLawFit, float]:
    """(baseline law, variant law, m) for trials of both variants (is_variant marks rows).
    `start` = (E, A, alpha, m) warm-starts a single descent (bootstrap resamples; E = 0
    keeps a fit without E). with_E=None falls back to the law without E when E falls to
    its bound 0, and the laws' `fallback` says so."""
    x, y, v = np.log(flops), np.log(loss), np.asarray(is_variant, dtype=float)
    if np.unique(x[v == 0]).size < 2 or np.unique(x[v == 1]).size < 2:
        raise ScalingError(
            "compute-multiplier fit: each variant needs trials at 2 or more compute values"
        )
    shift = x.mean()
    auto = with_E is None and start is None
    if start is not None and with_E is None:
        with_E = start[0] > 0
    why = ""
    if with_E is not False:
        E, A, alpha, m = _descend(x - shift, y, v, loss, start, shift, has_E=True)
        if not auto or not on_lower_bound_E(E, loss):
            return _laws(E, A, alpha, m, v)
        why = (
            "E fell to its bound 0 (no flattening towards an irreducible loss): fitted "
            "L(C) = A*(C/m)^-alpha"
        )
    _, A, alpha, m = _descend(x - shift, y, v, loss, start, shift, has_E=False)
    return _laws(0.0, A, alpha, m, v, fallback=why)


def _descend(
    x: np.ndarray,
    y: np.ndarray,
    v: np.ndarray,
    loss: np.ndarray,
    start: tuple[float, float, float, float] | None,
    shift: float,
    *,
    has_E: bool,
) -> tuple[float, float, float, float]:
    """L-BFGS-B from the starts; (E, A, alpha, m) in the raw parameterisation."""

    def objective(theta: np.ndarray) -> tuple[float, np.ndarray]:
        if has_E:
            return shift_objective(theta, x, y, v)
        value, grad = shift_objective(np.concatenate([[-np.inf], theta]), x, y, v)
        return value, grad[1:]

    if start is not None:
        E, A, alpha, m = start
        starts = [np.array([np.log(max(E, 1e-12)), np.log(A) - alpha * shift, alpha, np.log(m)])]
    else:
        starts = []
        for frac in _E_FRACTIONS if has_E else (0.0,):
            E = frac * loss.min()
            for alpha in _ALPHAS:
                resid = np.log(np.maximum(loss - E, 1e-12)) + alpha * x
                starts.append(np.array([np.log(max(E, 1e-12)), resid.mean(), alpha, 0.0]))
    bounds = [(None, float(y.min())), (None, None), (0.0, 10.0), (-20.0, 20.0)]
    if not has_E:
        starts = [s[1:] for s in starts]
        bounds = bounds[1:]
    with single_threaded_blas():
        best = min(
            (minimize(objective, s, jac=True, method="L-BFGS-B", bounds=bounds) for s in starts),
            key=lambda r: r.fun,
        )
    theta = np.concatenate([[-np.inf], best.x]) if not has_E else best.x
    e, a, alpha, log_m = theta
    if not np.all(np.isfinite(best.x)) or alpha <= 0:
        raise ScalingError("compute-multiplier fit did not converge (no positive exponent)")
    return float(np.exp(e)), float(np.exp(a + alpha * shift)), float(alpha), float(np.exp(log_m))


def _laws(
    E: float, A: float, alpha: float, m: float, v: np.ndarray, fallback: str = ""
) -> tuple[PowerLawFit, PowerLawFit, float]:
    n_b, n_v = int((v == 0).sum()), int((v == 1).sum())
    has_E = E > 0
    # L_variant(C) = E + A (C/m)^-alpha = E + (A m^alpha) C^-alpha
    return (
        PowerLawFit(E, A, alpha, n_b, has_E=has_E, fallback=fallback),
        PowerLawFit(E, A * m**alpha, alpha, n_v, has_E=has_E, fallback=fallback),
        m,
    )


def shift_objective(
    theta: np.ndarray, x: np.ndarray, y: np.ndarray, v: np.ndarray
) -> tuple[float, np.ndarray]:
    """Huber loss of log L_hat - log L and its gradient; theta = [e, a, alpha, log m],
    log L_hat = LSE(e, a - alpha (x - v log m)), x = centred log C, v = 1 on variant rows.
    e = -inf: the law without E."""
    e, a, alpha, log_m = theta
    u = x - v * log_m
    z = a - alpha * u
    pred = np.logaddexp(e, z)
    r = pred - y
    w0 = np.exp(e - pred)  # d pred / d e; 1 - w0 = d pred / d z
    g = np.clip(r, -HUBER_DELTA, HUBER_DELTA) / (HUBER_DELTA**2 * r.size)
    gz = g * (1.0 - w0)
    grad = np.array([g @ w0, gz.sum(), -(gz @ u), alpha * (gz @ v)])
    return float(huber(r, HUBER_DELTA).mean() / HUBER_DELTA**2), grad


def shift_jacobian(
    theta: np.ndarray, x: np.ndarray, v: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """log L_hat (n,) and its derivative (n, 4) with respect to theta = [e, a, alpha, log m]
    (shift_objective's law; e = -inf: the law without E, whose column is then 0)."""
    e, a, alpha, log_m = theta
    u = x - v * log_m
    pred = np.logaddexp(e, a - alpha * u)
    w0 = np.exp(e - pred)  # the share of E in L_hat
    wz = 1.0 - w0
    return pred, np.column_stack([w0, wz, -wz * u, alpha * wz * v])


def centred_theta(baseline: PowerLawFit, m: float, shift: float) -> np.ndarray:
    """[e, a, alpha, log m] of a fitted pair (fit_shift's parameters), for log C centred
    on `shift`; e = -inf for the law without E."""
    e = np.log(baseline.E) if baseline.has_E else -np.inf
    a = np.log(baseline.A) - baseline.alpha * shift
    return np.array([e, a, baseline.alpha, np.log(m)])


def theta_bounds(loss: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """fit_shift's bounds on [e, a, alpha, log m]: E below the lowest loss."""
    return (np.array([-np.inf, -np.inf, 0.0, -20.0]),
            np.array([float(np.log(loss).min()), np.inf, 10.0, 20.0]))  # fmt: skip
