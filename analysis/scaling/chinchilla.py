"""Chinchilla's parametric law (Hoffmann et al. 2022, Approach 3) and its compute optimum.

    L(N, D) = E + A / N^alpha + B / D^beta

N parameters, D training tokens, E irreducible loss. With C = 6 N D the loss-minimising
allocation is N*(C) = G (C/6)^a, D*(C) = G^-1 (C/6)^b with
a = beta/(alpha+beta), b = alpha/(alpha+beta), G = (alpha A / (beta B))^(1/(alpha+beta)).
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass

import numpy as np

from .bootstrap import EXACT_ROWS, Bootstrap, bootstrap, linearised_bootstrap
from .data import ScalingError, clean, require_distinct
from .objective import (
    _ALPHA_BOUNDS,
    HUBER_DELTA,
    LogLaw,
    centre,
    minimise,
    on_lower_bound_E,
    uncentre,
)
from .refine import Linearised, predict_and_jacobian

_WHAT = "Chinchilla fit L(N, D) = E + A/N^alpha + B/D^beta"
# Up to this many trials the grid search sees every trial; beyond, GRID_ROWS of them
# (docs/scaling.md, "At scale").
GRID_ROWS = 2000
N_STARTS = 6  # the grid's best starts L-BFGS-B descends from (objective.minimise's n_refine)

# Hoffmann et al.'s grid of initialisations (their Appendix D.2), alpha/beta also at 0.25.
_GRID = {
    "e": (-1.0, -0.5, 0.0, 0.5, 1.0),
    "a": (0.0, 5.0, 10.0, 15.0, 20.0, 25.0),
    "b": (0.0, 5.0, 10.0, 15.0, 20.0, 25.0),
    "alpha": (0.0, 0.25, 0.5, 1.0, 1.5, 2.0),
    "beta": (0.0, 0.25, 0.5, 1.0, 1.5, 2.0),
}


@dataclass(frozen=True)
class ChinchillaFit:
    """L(N, D) = E + A/N^alpha + B/D^beta; E = 0 and has_E False when E fell to its bound
    and the law without E was fitted instead (`fallback` says why)."""

    E: float
    A: float
    B: float
    alpha: float
    beta: float
    n_trials: int
    has_E: bool = True
    fallback: str = ""

    @property
    def form(self) -> str:
        return "E + A/N^alpha + B/D^beta" if self.has_E else "A/N^alpha + B/D^beta (no E)"

    def predict(self, n_params: np.ndarray | float, tokens: np.ndarray | float) -> np.ndarray:
        N = np.asarray(n_params, dtype=float)
        D = np.asarray(tokens, dtype=float)
        return self.E + self.A * N**-self.alpha + self.B * D**-self.beta

    @property
    def a(self) -> float:
        """Exponent of N*(C) ∝ C^a."""
        return self.beta / (self.alpha + self.beta)

    @property
    def b(self) -> float:
        """Exponent of D*(C) ∝ C^b."""
        return self.alpha / (self.alpha + self.beta)

    @property
    def G(self) -> float:
        return float(
            (self.alpha * self.A / (self.beta * self.B)) ** (1.0 / (self.alpha + self.beta))
        )

    def optimal(self, flops: np.ndarray | float) -> tuple[np.ndarray, np.ndarray]:
        """Compute-optimal (N*, D*) at budget C, with C = 6 N D."""
        c6 = np.asarray(flops, dtype=float) / 6.0
        return self.G * c6**self.a, c6**self.b / self.G

    def values(self) -> dict[str, float]:
        return {
            "E": self.E,
            "A": self.A,
            "B": self.B,
            "alpha": self.alpha,
            "beta": self.beta,
            "a": self.a,
            "b": self.b,
            "G": self.G,
        }


def _search(law: LogLaw, starts: np.ndarray, delta: float) -> np.ndarray:
    """objective.minimise from the grid's best starts. Beyond GRID_ROWS rows, grid and
    starts see GRID_ROWS of them (evenly spread in (log N, log D) order: every size and
    token count keeps its share) and L-BFGS-B then descends on all the rows from the best
    of those optima: a grid of 6,480 starts on 100,000 rows was ~2 x 10^9 terms and GBs of
    memory, for nothing but choosing where to start (docs/scaling.md, "At scale")."""
    if law.y.size <= GRID_ROWS or starts.shape[0] == 1:
        return minimise(law, _best_starts(law, starts, delta), delta=delta)[0]
    order = np.lexsort((law.X[:, 1], law.X[:, 0]))
    rows = order[np.linspace(0, law.y.size - 1, GRID_ROWS).round().astype(int)]
    sub = LogLaw(X=law.X[rows], y=law.y[rows], has_E=law.has_E)
    theta, _ = minimise(sub, _best_starts(sub, starts, delta), delta=delta)
    return minimise(law, theta[None], delta=delta)[0]


def _best_starts(law: LogLaw, starts: np.ndarray, delta: float) -> np.ndarray:
    """The N_STARTS starts of lowest objective, as objective.minimise picks them, the grid
    scored a few starts at a time (each start's objective is its own, so the pick is the
    same): ~3 MB of terms at a time instead of minimise's 512 starts x every row."""
    if starts.shape[0] <= N_STARTS:
        return starts
    per = max(1, (1 << 17) // law.y.size)
    values = np.concatenate([law.objective(starts[i : i + per], delta)
                             for i in range(0, starts.shape[0], per)])  # fmt: skip
    return starts[np.argsort(values)[:N_STARTS]]


def fit_chinchilla(
    n_params: np.ndarray,
    tokens: np.ndarray,
    loss: np.ndarray,
    *,
    start: ChinchillaFit | None = None,
    with_E: bool | None = None,
    delta: float = HUBER_DELTA,
) -> ChinchillaFit:
    """Approach 3: Huber (`delta`, default 1e-3) on log-space residuals
    LSE(a - alpha log N, b - beta log D, e) - log L, L-BFGS-B from the best points of
    Hoffmann's grid (or from `start` alone, as bootstrap resamples do). Beyond GRID_ROWS
    trials the grid and its starts search a subsample and one descent finishes on all the
    trials (`_search`).

    Needs >= 3 distinct N, >= 3 distinct D and >= 6 trials (5 constants). with_E=None
    (default) falls back to the law without E when E falls to its bound 0, and says so in
    `fallback`; a `start` keeps its form."""
    y, xs = clean(loss, {"n_params": n_params, "tokens": tokens}, what=_WHAT)
    require_distinct(xs["n_params"], 3, what=_WHAT, name="model sizes N")
    require_distinct(xs["tokens"], 3, what=_WHAT, name="token counts D")
    if y.size < 6:
        raise ScalingError(f"{_WHAT}: needs at least 6 trials for 5 constants; got {y.size}")
    auto = with_E is None and start is None
    if start is not None and with_E is None:
        with_E = start.has_E
    log_x = np.log(np.column_stack([xs["n_params"], xs["tokens"]]))
    shift = log_x.mean(axis=0)
    if with_E is not False:
        law = LogLaw(X=log_x - shift, y=np.log(y))
        if start is None:
            # theta order: [e, a, b, alpha, beta]
            starts = np.array(list(itertools.product(*_GRID.values())))
        else:
            s = start
            starts = np.array([[np.log(s.E), np.log(s.A), np.log(s.B), s.alpha, s.beta]])
        theta = _search(law, centre(starts, shift), delta)
        e, a, b, alpha, beta = uncentre(theta, shift)
        fit = ChinchillaFit(
            E=float(np.exp(e)),
            A=float(np.exp(a)),
            B=float(np.exp(b)),
            alpha=float(alpha),
            beta=float(beta),
            n_trials=y.size,
        )
        if not auto or not on_lower_bound_E(fit.E, y):
            return fit
    law = LogLaw(X=log_x - shift, y=np.log(y), has_E=False)
    if start is None:
        grid = {k: v for k, v in _GRID.items() if k != "e"}
        starts = np.array(list(itertools.product(*grid.values())))
    else:
        s = start
        starts = np.array([[np.log(s.A), np.log(s.B), s.alpha, s.beta]])
    theta = _search(law, centre(starts, shift), delta)
    a, b, alpha, beta = uncentre(theta, shift)
    why = (
        "E fell to its bound 0 (no flattening towards an irreducible loss): fitted "
        "L(N, D) = A/N^alpha + B/D^beta"
        if auto
        else (start.fallback if start is not None else "")
    )
    return ChinchillaFit(
        E=0.0,
        A=float(np.exp(a)),
        B=float(np.exp(b)),
        alpha=float(alpha),
        beta=float(beta),
        n_trials=y.size,
        has_E=False,
        fallback=why,
    )


def bootstrap_chinchilla(
    n_params: np.ndarray, tokens: np.ndarray, loss: np.ndarray, *, delta: float = HUBER_DELTA,
    n_resamples: int = 1000, level: float = 0.95, seed: int = 0,
) -> Bootstrap[ChinchillaFit]:  # fmt: skip
    """`bootstrap(fit_chinchilla, ...)` with the Huber `delta`, up to bootstrap.EXACT_ROWS trials;
    beyond, the same resamples each refit as the law linearised at the point fit
    (bootstrap.linearised_bootstrap): per resample a Newton solve on counts, O(n p^2),
    instead of ~40 L-BFGS-B steps on a copy of n rows (docs/scaling.md, "At scale")."""
    fit = functools.partial(fit_chinchilla, delta=delta)
    data = [np.asarray(a, dtype=float) for a in (n_params, tokens, loss)]
    finite = np.logical_and.reduce([np.isfinite(a) for a in data])
    if finite.sum() <= EXACT_ROWS:
        return bootstrap(fit, *data, n_resamples=n_resamples, level=level, seed=seed)
    n, d, y = (a[finite] for a in data)
    point = fit(n, d, y)
    log_x = np.log(np.column_stack([n, d]))
    shift = log_x.mean(axis=0)
    theta = centre(_raw(point), shift)
    pred, jac = predict_and_jacobian((log_x - shift)[None], theta[None], point.has_E)
    low, high = np.full(theta.size, -np.inf), np.full(theta.size, np.inf)
    low[-2:], high[-2:] = _ALPHA_BOUNDS  # the exponents' bounds, as steps from the fit
    law = Linearised(pred[0] - np.log(y), jac[0], delta, low - theta, high - theta)

    def values(step: np.ndarray) -> dict[str, float]:
        return _from_theta(uncentre(theta + step, shift), point).values()

    return linearised_bootstrap(point, law, values, n_resamples=n_resamples, level=level,
                                seed=seed)  # fmt: skip


def _raw(fit: ChinchillaFit) -> np.ndarray:
    """[log E?, log A, log B, alpha, beta] (robust.raw_theta, which imports this module)."""
    head = [np.log(fit.E)] if fit.has_E else []
    return np.array(head + [np.log(fit.A), np.log(fit.B), fit.alpha, fit.beta])


def _from_theta(raw: np.ndarray, like: ChinchillaFit) -> ChinchillaFit:
    """The law with raw constants `raw`, of the same form and trials as `like`."""
    e = [float(np.exp(raw[0]))] if like.has_E else [0.0]
    a, b, alpha, beta = raw[-4:]
    return ChinchillaFit(*e, float(np.exp(a)), float(np.exp(b)), float(alpha), float(beta),
                         like.n_trials, like.has_E, like.fallback)  # fmt: skip
