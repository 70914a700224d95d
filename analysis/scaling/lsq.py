"""Least-squares fits of the log-space laws, with the delta method for their uncertainty.

    log L_i = LSE(e, a_j - alpha_j (log x_ij - shift_j)) + eps_i,   eps_i ~ N(0, sigma^2)

(objective.LogLaw; the power law L(C) and Chinchilla's L(N, D) are its k = 1 and k = 2
cases). Least squares is the maximum-likelihood fit under log-normal noise, and it gives
what a prediction interval needs: the covariance of the constants, sigma^2 (J'J)^-1 with J
the Jacobian at the optimum and sigma^2 = SSR / (n - p), and Student-t quantiles with n - p
degrees of freedom. It starts from the Huber fit (powerlaw.py, chinchilla.py), which has
searched a grid of starts, and falls back to the law without E as that fit does.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats
from scipy.optimize import least_squares

from .bootstrap import Interval
from .chinchilla import ChinchillaFit, fit_chinchilla
from .data import ScalingError, clean
from .objective import (
    _ALPHA_BOUNDS,
    LogLaw,
    centre,
    on_lower_bound_E,
    single_threaded_blas,
    uncentre,
)

_E_AT_ZERO = (
    "E fell to its bound 0 (no flattening towards an irreducible loss): fitted the law without E"
)


@dataclass(frozen=True, eq=False)
class LsqFit:
    """A least-squares law with the covariance of its (centred) constants."""

    law: LogLaw  # centred log covariates and log losses of the fitted points
    shift: np.ndarray  # the centring of log x
    theta: np.ndarray  # [e?, a_1..a_k, alpha_1..alpha_k], centred
    cov: np.ndarray  # covariance of theta; NaN when there are no degrees of freedom
    sigma: float  # residual standard deviation of log L (NaN without dof)
    fallback: str  # why the law without E was fitted ('' when it was not)
    covariates: tuple[str, ...]  # ("C",) or ("N", "D")

    @property
    def has_E(self) -> bool:
        return self.law.has_E

    @property
    def n(self) -> int:
        return int(self.law.y.size)

    @property
    def dof(self) -> int:
        return self.n - self.theta.size

    @property
    def residuals(self) -> np.ndarray:
        """log L_hat - log L at the fitted points."""
        return self.law.predict_log(self.theta) - self.law.y

    @property
    def form(self) -> str:
        terms = {"C": "A·C^-alpha", "N": "A/N^alpha", "D": "B/D^beta"}
        body = " + ".join(terms[c] for c in self.covariates)
        return f"E + {body}" if self.has_E else f"{body} (no E)"

    def values(self) -> dict[str, float]:
        raw = uncentre(self.theta, self.shift)
        o, k = self.law.offset, self.law.k
        names = _names(self.covariates)
        out = {"E": float(np.exp(raw[0])) if self.has_E else 0.0}
        for j in range(k):
            out[names[j][0]] = float(np.exp(raw[o + j]))
            out[names[j][1]] = float(raw[o + k + j])
        return out

    def intervals(self, level: float = 0.95) -> dict[str, Interval]:
        """Delta-method t intervals: E and the scales are log-normal (exp of e, a), the
        exponents symmetric and clipped to their bounds [0, 10]. NaN without dof."""
        o, k = self.law.offset, self.law.k
        t = _t(level, self.dof)
        raw = uncentre(self.theta, self.shift)
        names = _names(self.covariates)
        out: dict[str, Interval] = {}

        def log_normal(name: str, value: float, grad: np.ndarray) -> None:
            se = float(np.sqrt(max(grad @ self.cov @ grad, 0.0)))
            out[name] = Interval(
                np.exp(value), np.exp(value - t * se), np.exp(value + t * se), level
            )

        if self.has_E:
            log_normal("E", raw[0], np.eye(self.theta.size)[0])
        else:
            out["E"] = Interval(0.0, 0.0, 0.0, level)
        for j in range(k):
            grad = np.zeros(self.theta.size)
            grad[o + j], grad[o + k + j] = 1.0, self.shift[j]  # raw a = a' + alpha * shift
            log_normal(names[j][0], raw[o + j], grad)
            se = float(np.sqrt(max(self.cov[o + k + j, o + k + j], 0.0)))
            low, high = _ALPHA_BOUNDS
            alpha = raw[o + k + j]
            out[names[j][1]] = Interval(
                alpha, max(alpha - t * se, low), min(alpha + t * se, high), level
            )
        return out

    def predict_log(self, *covariates: np.ndarray | float) -> tuple[np.ndarray, np.ndarray]:
        """(log L_hat, its standard error) at new covariates (C, or N and D)."""
        x = np.column_stack([np.log(np.atleast_1d(np.asarray(c, dtype=float))) for c in covariates])
        new = LogLaw(X=x - self.shift, y=np.zeros(x.shape[0]), has_E=self.has_E)
        value, jac = new.residuals_and_jacobian(self.theta)
        var = np.einsum("ip,pq,iq->i", jac, self.cov, jac)
        return value, np.sqrt(np.maximum(var, 0.0))

    def predict(self, *covariates: np.ndarray | float) -> np.ndarray:
        return np.exp(self.predict_log(*covariates)[0])

    def prediction_interval(
        self, *covariates: np.ndarray | float, level: float = 0.95
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(L_hat, low, high) for one new run at the covariates: the law's uncertainty and
        one run's scatter sigma, t quantile with n - p dof (NaN bounds without dof)."""
        mean, se = self.predict_log(*covariates)
        half = _t(level, self.dof) * np.sqrt(se**2 + self.sigma**2)
        return np.exp(mean), np.exp(mean - half), np.exp(mean + half)

    def elasticity(self, *covariates: np.ndarray | float) -> np.ndarray:
        """-d log L / d log x_1 of the law (the local slope in log-log; for L(C), how many
        percent the loss falls per percent more compute)."""
        x = np.column_stack([np.log(np.atleast_1d(np.asarray(c, dtype=float))) for c in covariates])
        new = LogLaw(X=x - self.shift, y=np.zeros(x.shape[0]), has_E=self.has_E)
        _, jac = new.residuals_and_jacobian(self.theta)
        o, k = self.law.offset, self.law.k
        return jac[:, o] * self.theta[o + k]  # softmax weight of the term times its exponent


def lsq_power_law(flops: np.ndarray, loss: np.ndarray, *, with_E: bool = True) -> LsqFit:
    """L(C) by least squares (module doc), from a few starts (E at fractions of the lowest
    loss, A and alpha by regression of log(L - E) on log C). Falls back to the law without
    E, saying why in `fallback`, when E falls to 0 or the points are too few for it (three
    trials, or two compute values); with_E=False fits that law directly."""
    y, xs = clean(loss, {"flops": flops}, what="least-squares L(C)")
    c = xs["flops"]
    distinct = np.unique(c).size
    if distinct < 2 or y.size < 3:
        raise ScalingError(
            f"least-squares L(C): needs at least 3 trials at 2 or more compute values; got "
            f"{y.size} trials at {distinct}"
        )
    log_c = np.log(c)[:, None]
    if not with_E:
        return _refine(log_c, y, _no_e_start(log_c[:, 0], y), ("C",), "")
    if distinct < 3 or y.size < 4:
        why = f"{y.size} trials at {distinct} compute values are too few for E: fitted A·C^-alpha"
        return _refine(log_c, y, _no_e_start(log_c[:, 0], y), ("C",), why)
    fits = []
    for frac in (0.3, 0.6, 0.85, 0.95):
        E = frac * y.min()
        slope, intercept = np.polyfit(log_c[:, 0], np.log(y - E), 1)
        start = np.array([np.log(E), intercept, float(np.clip(-slope, 1e-3, 9.0))])
        fits.append(_refine(log_c, y, start, ("C",), "", fall_back=False))
    best = min(fits, key=lambda f: float(f.residuals @ f.residuals))
    if on_lower_bound_E(best.values()["E"], y):
        return _refine(log_c, y, _no_e_start(log_c[:, 0], y), ("C",), _E_AT_ZERO)
    return best


def _no_e_start(log_c: np.ndarray, loss: np.ndarray) -> np.ndarray:
    slope, intercept = np.polyfit(log_c, np.log(loss), 1)
    return np.array([intercept, float(np.clip(-slope, 0.0, 9.0))])


def lsq_chinchilla(
    n_params: np.ndarray, tokens: np.ndarray, loss: np.ndarray, *, with_E: bool = True
) -> LsqFit:
    """Chinchilla's L(N, D) by least squares, from the Huber fit (which searches
    Hoffmann's grid of starts and falls back to the law without E as that fit does)."""
    start: ChinchillaFit = fit_chinchilla(n_params, tokens, loss, with_E=None if with_E else False)
    y, xs = clean(loss, {"n_params": n_params, "tokens": tokens}, what="least-squares L(N, D)")
    theta = [np.log(start.A), np.log(start.B), start.alpha, start.beta]
    if start.has_E:
        theta = [np.log(start.E)] + theta
    log_x = np.log(np.column_stack([xs["n_params"], xs["tokens"]]))
    return _refine(log_x, y, np.array(theta), ("N", "D"), start.fallback)


def _refine(
    log_x: np.ndarray, loss: np.ndarray, theta_raw: np.ndarray, covariates: tuple[str, ...],
    fallback: str, *, fall_back: bool = True,
) -> LsqFit:  # fmt: skip
    k = log_x.shape[1]
    has_E = theta_raw.size == 2 * k + 1
    shift = log_x.mean(axis=0)
    law = LogLaw(X=log_x - shift, y=np.log(loss), has_E=has_E)
    theta0 = centre(theta_raw, shift)
    low = np.r_[np.full(law.offset + k, -np.inf), np.full(k, _ALPHA_BOUNDS[0])]
    high = np.r_[np.full(law.offset + k, np.inf), np.full(k, _ALPHA_BOUNDS[1])]
    theta0 = np.clip(theta0, low, high)
    if has_E:  # e stays below the lowest loss: E above it cannot be fitted in log space
        high[0] = np.log(loss.min())
        theta0[0] = min(theta0[0], high[0] - 1e-9)
    last: dict[bytes, tuple[np.ndarray, np.ndarray]] = {}

    def both(t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """least_squares asks for r and J at the same point in turn: compute them once."""
        key = t.tobytes()
        if key not in last:
            last.clear()
            last[key] = law.residuals_and_jacobian(t)
        return last[key]

    with single_threaded_blas():
        res = least_squares(
            lambda t: both(t)[0],
            theta0,
            jac=lambda t: both(t)[1],
            bounds=(low, high),
            method="trf",
            x_scale="jac",
        )
    theta = res.x
    if fall_back and has_E and on_lower_bound_E(float(np.exp(theta[0])), loss):
        why = fallback or _E_AT_ZERO
        return _refine(log_x, loss, np.delete(uncentre(theta, shift), 0), covariates, why)
    r, jac = law.residuals_and_jacobian(theta)
    dof = r.size - theta.size
    sigma = float(np.sqrt(r @ r / dof)) if dof > 0 else float("nan")
    cov = sigma**2 * np.linalg.pinv(jac.T @ jac) if dof > 0 else np.full((theta.size,) * 2, np.nan)
    return LsqFit(law, shift, theta, cov, sigma, fallback, covariates)


def _names(covariates: tuple[str, ...]) -> list[tuple[str, str]]:
    return [("A", "alpha"), ("B", "beta")][: len(covariates)]


def _t(level: float, dof: int) -> float:
    return float(stats.t.ppf((1 + level) / 2, dof)) if dof > 0 else float("nan")
