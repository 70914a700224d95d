"""The Huber fit of Chinchilla's law (objective.py), refined from a warm start for many
problems at once: a fold of a backtest, a ladder of a coverage test.

Iteratively reweighted Gauss-Newton with Levenberg-Marquardt damping: the weights
w = psi(r) / r = min(1, delta / |r|) make each step a weighted least-squares one, and its
fixed points satisfy J' psi(r) = 0, the Huber fit's own optimality condition, so it lands
on the optimum L-BFGS-B reaches from the same start (tests/orchestrator/test_forecast_nd.py).
Each problem is (B, n) rows of log (N, D) centred, log L and a 0/1 row mask; numpy's
batched solves take the place of B separate L-BFGS-B runs (about 100 ms each on 30 rows).
"""

from __future__ import annotations

import numpy as np

from .objective import _ALPHA_BOUNDS, HUBER_DELTA, _logsumexp, huber


def predict_and_jacobian(X: np.ndarray, theta: np.ndarray, has_E: bool):  # noqa: ANN201
    """log L_hat (B, n) and d log L_hat / d theta (B, n, p) for centred X (B, n, 2) and
    theta (B, p) = [e?, a, b, alpha, beta]."""
    o = 1 if has_E else 0
    a, alpha = theta[:, o : o + 2], theta[:, o + 2 :]
    z = a[:, None, :] - alpha[:, None, :] * X
    if has_E:
        z = np.concatenate([np.broadcast_to(theta[:, None, :1], z.shape[:2] + (1,)), z], -1)
    value, w = _logsumexp(z)
    wz = w[..., o:]
    jac = np.concatenate([w[..., :o], wz, -wz * X], axis=-1)
    return value, jac


def refine(
    X: np.ndarray, y: np.ndarray, mask: np.ndarray, theta0: np.ndarray, *, has_E: bool,
    delta: float = HUBER_DELTA, max_iter: int = 200, tol: float = 1e-8,
) -> np.ndarray:  # fmt: skip
    """The Huber optimum near theta0 (B, p) for each of B problems (module doc)."""
    theta = np.array(theta0, dtype=float)
    p = theta.shape[1]
    lo = np.r_[np.full(p - 2, -np.inf), np.full(2, _ALPHA_BOUNDS[0])]
    hi = np.r_[np.full(p - 2, np.inf), np.full(2, _ALPHA_BOUNDS[1])]
    mask = mask.astype(float)

    def objective(t: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        pred, jac = predict_and_jacobian(X[rows], t, has_E)
        r = pred - y[rows]
        return (huber(r, delta) * mask[rows]).sum(axis=1), r, jac

    f, r, jac = objective(theta, np.arange(theta.shape[0]))
    lam = np.full(theta.shape[0], 1e-3)
    act = np.arange(theta.shape[0])  # the problems still moving
    eye = np.eye(p)
    for _ in range(max_iter):
        if act.size == 0:
            break
        ra, ja, ma = r[act], jac[act], mask[act]
        w = ma * np.minimum(1.0, delta / np.maximum(np.abs(ra), 1e-300))
        jw = ja * w[..., None]
        h = np.einsum("bnp,bnq->bpq", jw, ja)
        g = np.einsum("bnp,bn->bp", jw, ra)
        diag = np.einsum("bpp->bp", h)[:, :, None] * eye
        step = -np.linalg.solve(h + lam[act, None, None] * diag + 1e-12 * eye, g[..., None])
        new = np.clip(theta[act] + step[..., 0], lo, hi)
        f_new, r_new, jac_new = objective(new, act)
        better = f_new <= f[act]
        done = better & ((np.abs(new - theta[act]).max(axis=1) < tol)
                         | (f[act] - f_new <= 1e-10 * f[act]))  # fmt: skip
        up = act[better]
        theta[up], f[up], r[up], jac[up] = (
            new[better],
            f_new[better],
            r_new[better],
            jac_new[better],
        )
        lam[act] = np.where(better, np.maximum(lam[act] / 3, 1e-9), lam[act] * 4)
        act = act[~done & (lam[act] < 1e12)]
    return theta
