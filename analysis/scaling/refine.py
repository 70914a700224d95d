"""The Huber fit of Chinchilla's law (objective.py), refined from a warm start for many
problems at once: a fold of a backtest, a ladder of a coverage test, a left-out point of
the influence check, a bootstrap resample.

Iteratively reweighted Gauss-Newton with Levenberg-Marquardt damping: the weights
w = psi(r) / r = min(1, delta / |r|) make each step a weighted least-squares one, and its
fixed points satisfy J' psi(r) = 0, the Huber fit's own optimality condition, so it lands
on the optimum L-BFGS-B reaches from the same start (tests/orchestrator/test_forecast_nd.py).
Each problem is (B, n) rows of log (N, D) centred, log L and a 0/1 row mask (or a count:
a row drawn twice weighs twice); numpy's batched solves take the place of B separate
L-BFGS-B runs (about 100 ms each on 30 rows). Problems are independent, so they are
refined in batches of at most BATCH_ROWS rows in all, which bounds the memory whatever B.

At scale (docs/scaling.md, "At scale") two cheaper relatives use the Jacobian J and
residuals r at the fit alone, O(n p^2):

- `leave_one_out_steps`: the one Newton step from the fit without each point, by
  Sherman-Morrison, the screen of the influence check;
- `Linearised`: the Huber fit of the law linearised at the fit, log L_hat = r + J step,
  for many count-weighted problems (bootstrap resamples) at once.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .objective import _ALPHA_BOUNDS, HUBER_DELTA, huber

BATCH_ROWS = 1 << 19  # problems x rows refined together (each (B, n, p) array ~20 MB)


def predict_and_jacobian(X: np.ndarray, theta: np.ndarray, has_E: bool):  # noqa: ANN201
    """log L_hat (B, n) and d log L_hat / d theta (B, n, p) for centred X (B, n, 2) and
    theta (B, p) = [e?, a, b, alpha, beta]. The log-sum-exp of the two or three terms
    written out term by term: numpy's reductions over a last axis of 2 or 3 took most of
    the refits' time; the arithmetic is objective._logsumexp's, number for number."""
    o = 1 if has_E else 0
    a, alpha = theta[:, o : o + 2], theta[:, o + 2 :]
    z = a[:, None, :] - alpha[:, None, :] * X
    terms = [z[..., 0], z[..., 1]]
    if has_E:
        terms.insert(0, np.broadcast_to(theta[:, :1], z.shape[:2]))
    m = terms[0]
    for t in terms[1:]:
        m = np.maximum(m, t)
    w = [np.exp(t - m) for t in terms]
    total = w[0] + w[1]
    if has_E:
        total += w[2]
    jac = np.empty(z.shape[:2] + (o + 4,))
    for j, wj in enumerate(w):
        np.divide(wj, total, out=jac[..., j])
    for k in range(2):
        np.multiply(-jac[..., o + k], X[..., k], out=jac[..., o + 2 + k])
    return m + np.log(total), jac


def refine(
    X: np.ndarray, y: np.ndarray, mask: np.ndarray, theta0: np.ndarray, *, has_E: bool,
    delta: float = HUBER_DELTA, max_iter: int = 200, tol: float = 1e-8,
) -> np.ndarray:  # fmt: skip
    """The Huber optimum near theta0 (B, p) for each of B problems (module doc)."""
    theta = np.array(theta0, dtype=float)
    per = max(1, BATCH_ROWS // max(X.shape[1], 1))
    for lo in range(0, theta.shape[0], per):
        part = slice(lo, lo + per)
        theta[part] = _refine_batch(X[part], y[part], mask[part], theta[part], has_E=has_E,
                                    delta=delta, max_iter=max_iter, tol=tol)  # fmt: skip
    return theta


def _refine_batch(
    X: np.ndarray, y: np.ndarray, mask: np.ndarray, theta0: np.ndarray, *, has_E: bool,
    delta: float, max_iter: int, tol: float,
) -> np.ndarray:  # fmt: skip
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


def huber_hessian(r: np.ndarray, jac: np.ndarray, delta: float) -> np.ndarray:
    """sum_i psi'(r_i) J_i J_i' (p, p): the derivative of the Huber fit's estimating
    equation J' psi(r) = 0 (psi' = 1 within delta, 0 beyond; the curvature of r itself
    left out, as Gauss-Newton does). The weights psi(r) / r of the reweighted steps would
    understate how far the fit moves when delta is below the noise (measured: intervals 3x
    too narrow), which is why the steps here use psi'."""
    inside = (np.abs(r) <= delta).astype(float)
    return (jac * inside[:, None]).T @ jac


def leave_one_out_steps(r: np.ndarray, jac: np.ndarray, delta: float = HUBER_DELTA) -> np.ndarray:
    """(n, p): for each point k, the Newton step from the fit (residuals r (n,), Jacobian
    jac (n, p)) to the fit without k: -(H - psi'_k J_k J_k')^-1 (g - psi_k J_k), with
    g = J' psi(r) (~0 at the fit) and H = huber_hessian, by Sherman-Morrison. A point the
    others cannot do without (psi'_k h_k >= 1, h_k its leverage) gets an infinite step."""
    psi = np.clip(r, -delta, delta)
    d_psi = (np.abs(r) <= delta).astype(float)
    h_mat = huber_hessian(r, jac, delta)
    h_inv = np.linalg.pinv(h_mat + 1e-12 * np.diag(np.diag(h_mat)))
    u = jac @ h_inv  # row k: H^-1 J_k (H symmetric)
    leverage = np.einsum("np,np->n", u, jac)
    v = (jac.T @ psi)[None, :] - psi[:, None] * jac  # g without k
    hv = v @ h_inv
    denom = 1.0 - d_psi * leverage
    with np.errstate(divide="ignore", invalid="ignore"):
        step = -(hv + u * (d_psi * np.einsum("np,np->n", u, v) / denom)[:, None])
    step[denom <= 1e-9] = np.inf
    return step


@dataclass(frozen=True, eq=False)
class Linearised:
    """The Huber fit of log L_hat = log L_fit + J step (the law linearised at its fit:
    residuals r (n,), Jacobian jac (n, p)) for count-weighted problems, each solved by
    Newton's method with psi' (huber_hessian) and step halving: the objective is piecewise
    quadratic, so it ends when the rows within delta stop changing (3-5 steps). The error
    against refitting the law itself is second order in the step, O(1/n) where a
    resample's step is O(1/sqrt(n))."""

    r: np.ndarray
    jac: np.ndarray
    delta: float = HUBER_DELTA
    low: np.ndarray | None = None  # bounds on the step (p,), e.g. the exponents' [0, 10]
    high: np.ndarray | None = None
    outer: np.ndarray = field(init=False, repr=False)  # (n, p (p + 1) / 2): J_i J_i', upper

    def __post_init__(self) -> None:
        i, j = np.triu_indices(self.jac.shape[1])
        object.__setattr__(self, "outer", self.jac[:, i] * self.jac[:, j])

    def _hessians(self, weights: np.ndarray) -> np.ndarray:
        """(B, p, p): sum_i weights_bi J_i J_i' for weights (B, n)."""
        p = self.jac.shape[1]
        i, j = np.triu_indices(p)
        flat = weights @ self.outer
        h = np.empty((weights.shape[0], p, p))
        h[:, i, j] = flat
        h[:, j, i] = flat
        return h

    def objective(self, counts: np.ndarray, step: np.ndarray) -> np.ndarray:
        """sum_i counts_bi huber(r_i + J_i step_b) per problem (B,)."""
        return self._at(counts, step)[1]

    def _at(self, counts: np.ndarray, step: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The linearised residuals u (B, n) at `step` and the objective there (B,)."""
        u = self.r + step @ self.jac.T
        a = np.abs(u)
        m = np.minimum(a, self.delta)
        return u, np.einsum("bn,bn->b", counts, m * (a - 0.5 * m))  # huber(u), weighted

    def solve(self, counts: np.ndarray, max_iter: int = 50, tol: float = 1e-12) -> np.ndarray:
        """(B, p) steps from the fit, one per row of counts (B, n); NaN where Newton did
        not settle within max_iter."""
        B, p = counts.shape[0], self.jac.shape[1]
        low = np.full(p, -np.inf) if self.low is None else self.low
        high = np.full(p, np.inf) if self.high is None else self.high
        step = np.zeros((B, p))
        u, f = self._at(counts, step)
        act = np.arange(B)
        ridge = 1e-10 * (counts @ self.jac**2)  # keeps H invertible when few rows are within delta
        for _ in range(max_iter):
            if act.size == 0:
                break
            c, ua = counts[act], u[act]
            g = (c * np.clip(ua, -self.delta, self.delta)) @ self.jac
            h = self._hessians(c * (np.abs(ua) <= self.delta))
            h += ridge[act][:, :, None] * np.eye(p)
            move = -np.linalg.solve(h, g[..., None])[..., 0]
            new, u_new, f_new = self._halve(c, step[act], move, f[act], ua, low, high)
            settled = np.abs(new - step[act]).max(axis=1) <= tol * (1 + np.abs(new).max(axis=1))
            settled |= f[act] - f_new <= 1e-14 * np.abs(f[act])
            step[act], u[act], f[act] = new, u_new, f_new
            act = act[~settled]
        step[act] = np.nan
        return step

    def _halve(
        self, counts: np.ndarray, step: np.ndarray, move: np.ndarray, f: np.ndarray,
        u: np.ndarray, low: np.ndarray, high: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
        """The Newton move, halved (up to 30 times) where it does not lower the objective;
        the new steps, their residuals u and objective."""
        scale = np.ones(step.shape[0])
        new = np.clip(step + move, low, high)
        u_new, f_new = self._at(counts, new)
        limit = f + 1e-13 * np.abs(f)  # no higher than rounding: at the optimum a move is ~0
        for _ in range(30):
            worse = f_new > limit
            if not worse.any():
                break
            scale[worse] /= 2
            new[worse] = np.clip(step[worse] + scale[worse, None] * move[worse], low, high)
            u_new[worse], f_new[worse] = self._at(counts[worse], new[worse])
        stay = f_new > limit  # never got lower: stay where it was
        new[stay], u_new[stay], f_new[stay] = step[stay], u[stay], f[stay]
        return new, u_new, f_new
