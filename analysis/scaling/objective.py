"""The one objective behind every parametric fit here (Hoffmann et al. 2022, Approach 3).

A law with an irreducible term and k power-law terms,

    L = E + sum_j A_j * x_j^(-alpha_j)        (x_j = N, D or C),

is fitted in log space with e = log E, a_j = log A_j:

    log L_hat = LSE(e, a_1 - alpha_1 log x_1, ..., a_k - alpha_k log x_k)

minimising the Huber loss (delta = 1e-3) of r = log L_hat - log L with L-BFGS-B from the
best points of a grid of starts. Rows can switch terms off (mask), which lets two variants
share E while keeping their own A and alpha.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass

import numpy as np
from scipy.optimize import minimize

from .data import ScalingError

HUBER_DELTA = 1e-3
# Exponents live in [0, 10]: a negative exponent would make loss grow with scale.
_ALPHA_BOUNDS = (0.0, 10.0)
E_AT_ZERO = 1e-3  # E below this share of the lowest loss counts as on its bound 0


@dataclass(frozen=True)
class LogLaw:
    """Design of a fit: log covariates X (n, k), optional term mask (n, k), log losses y.

    theta = [e, a_1..a_k, alpha_1..alpha_k]; with has_E=False the law has no irreducible
    term (L = sum_j A_j x_j^-alpha_j) and theta = [a_1..a_k, alpha_1..alpha_k]."""

    X: np.ndarray
    y: np.ndarray
    mask: np.ndarray | None = None
    has_E: bool = True

    @property
    def k(self) -> int:
        return self.X.shape[1]

    @property
    def offset(self) -> int:
        """Index of a_1 in theta."""
        return 1 if self.has_E else 0

    def terms(self, theta: np.ndarray) -> np.ndarray:
        """Z (..., n, k[+1]) for a theta (...) laid out as in the class doc."""
        theta = np.asarray(theta, dtype=float)
        o = self.offset
        a = theta[..., o : o + self.k]
        alpha = theta[..., o + self.k :]
        z = a[..., None, :] - alpha[..., None, :] * self.X  # (..., n, k)
        if self.mask is not None:
            z = np.where(self.mask, z, -np.inf)
        if not self.has_E:
            return z
        e = np.broadcast_to(theta[..., None, :1], z.shape[:-1] + (1,))
        return np.concatenate([e, z], axis=-1)

    def predict_log(self, theta: np.ndarray) -> np.ndarray:
        return _logsumexp(self.terms(theta))[0]

    def objective(self, theta: np.ndarray, delta: float = HUBER_DELTA) -> np.ndarray:
        """Mean Huber loss / delta^2 for one theta or a stack of them (grid search)."""
        r = self.predict_log(theta) - self.y
        return huber(r, delta).mean(axis=-1) / delta**2

    def residuals_and_jacobian(self, theta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """r = log L_hat - log L (n,) and dr/dtheta (n, p): least squares and the delta
        method. The derivative of LSE is its softmax weight on each term."""
        value, w = _logsumexp(self.terms(theta))
        o = self.offset
        wz = w[:, o:]
        jac = np.concatenate([w[:, :o], wz, -wz * self.X], axis=1)
        return value - self.y, jac

    def objective_and_grad(
        self, theta: np.ndarray, delta: float = HUBER_DELTA
    ) -> tuple[float, np.ndarray]:
        """Objective and gradient for one theta (the L-BFGS inner loop, kept lean)."""
        k, o = self.k, self.offset
        a, alpha = theta[o : o + k], theta[o + k :]
        z = a - alpha * self.X  # (n, k)
        if self.mask is not None:
            z = np.where(self.mask, z, -np.inf)
        if self.has_E:
            e = theta[0]
            m = np.maximum(z.max(axis=1), e)
            w0 = np.exp(e - m)
        else:
            m = z.max(axis=1)
            w0 = np.zeros_like(m)
        wz = np.exp(z - m[:, None])
        s = w0 + wz.sum(axis=1)
        r = m + np.log(s) - self.y
        g = np.clip(r, -delta, delta) / (delta**2 * r.size * s)  # d f/d r, over the LSE sum
        gz = g[:, None] * wz  # d f / d z_j (softmax weight times d f/d r)
        head = [[g @ w0]] if self.has_E else []
        grad = np.concatenate(head + [gz.sum(axis=0), -np.einsum("nk,nk->k", gz, self.X)])
        return float(huber(r, delta).mean() / delta**2), grad


def _logsumexp(z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """LSE over the last axis and its softmax (scipy's version costs more than the fit on
    100 rows). Every row has a finite term (e, or an unmasked one), so the max is too."""
    m = z.max(axis=-1, keepdims=True)
    w = np.exp(z - m)
    s = w.sum(axis=-1, keepdims=True)
    return (m + np.log(s))[..., 0], w / s


def huber(r: np.ndarray, delta: float = HUBER_DELTA) -> np.ndarray:
    ar = np.abs(r)
    return np.where(ar <= delta, 0.5 * r * r, delta * (ar - 0.5 * delta))


@functools.cache
def _blas_controller() -> object | None:
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:  # optional: only a speed-up
        return None
    return ThreadpoolController()


def single_threaded_blas() -> contextlib.AbstractContextManager:
    """L-BFGS-B's tiny BLAS calls on 5-vectors run ~100x slower when OpenBLAS spreads them
    over threads on a busy machine (measured: 3 ms instead of 30 us per step)."""
    controller = _blas_controller()
    if controller is None:
        return contextlib.nullcontext()
    return controller.limit(limits=1, user_api="blas")


def minimise(
    law: LogLaw, starts: np.ndarray, n_refine: int = 6, delta: float = HUBER_DELTA
) -> tuple[np.ndarray, float]:
    """L-BFGS-B from the `n_refine` grid points with the lowest objective; the best wins.

    `starts` is (S, 2k+1); pass a single row to warm-start (bootstrap resamples). `delta`
    is the Huber loss's: residuals in log loss beyond it count linearly.
    """
    if not (np.isfinite(delta) and delta > 0):
        raise ScalingError(f"the Huber delta must be a positive number, got {delta}")
    starts = np.atleast_2d(np.asarray(starts, dtype=float))
    if starts.shape[0] > n_refine:
        chunks = np.array_split(starts, 1 + starts.shape[0] // 512)
        values = np.concatenate([law.objective(chunk, delta) for chunk in chunks])
        starts = starts[np.argsort(values)[:n_refine]]
    bounds = [(None, None)] * (law.offset + law.k) + [_ALPHA_BOUNDS] * law.k
    best_theta, best_f = None, np.inf
    for theta0 in starts:
        with single_threaded_blas():
            res = minimize(
                law.objective_and_grad,
                theta0,
                args=(delta,),
                jac=True,
                method="L-BFGS-B",
                bounds=bounds,
                # The objective is O(1) by construction, so these tolerances are meaningful
                # (a raw Huber loss of ~1e-6 stops L-BFGS at its first step).
                options={"maxiter": 2000, "ftol": 1e-13, "gtol": 1e-9},
            )
        if np.isfinite(res.fun) and res.fun < best_f:
            best_theta, best_f = res.x, float(res.fun)
    if best_theta is None:
        raise ScalingError("the fit found no finite objective from any start")
    return best_theta, best_f


def centre(theta: np.ndarray, shift: np.ndarray) -> np.ndarray:
    """Raw theta -> theta for covariates log x - shift (a_j' = a_j - alpha_j * shift_j).

    Centring the log covariates decorrelates a_j from alpha_j, which L-BFGS needs at
    x ~ 1e20 (log x ~ 46). Works with or without e (theta has 2k+1 or 2k entries)."""
    theta = np.array(theta, dtype=float)
    k = shift.size
    o = theta.shape[-1] - 2 * k
    theta[..., o : o + k] -= theta[..., o + k :] * shift
    return theta


def uncentre(theta: np.ndarray, shift: np.ndarray) -> np.ndarray:
    theta = np.array(theta, dtype=float)
    k = shift.size
    o = theta.shape[-1] - 2 * k
    theta[..., o : o + k] += theta[..., o + k :] * shift
    return theta


def on_lower_bound_E(E: float, loss: np.ndarray) -> bool:
    """E has fallen to its bound 0: below a thousandth of the lowest loss it explains
    nothing (the demo's laws once reported E = 1e-11 with an interval [0, 2e-11])."""
    return bool(E < E_AT_ZERO * np.min(loss))


def alpha_on_bound(alpha: float) -> bool:
    low, high = _ALPHA_BOUNDS
    return bool(alpha <= low + 1e-6 or alpha >= high - 1e-6)
