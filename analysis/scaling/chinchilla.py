"""Chinchilla's parametric law (Hoffmann et al. 2022, Approach 3) and its compute optimum.

    L(N, D) = E + A / N^alpha + B / D^beta

N parameters, D training tokens, E irreducible loss. With C = 6 N D the loss-minimising
allocation is N*(C) = G (C/6)^a, D*(C) = G^-1 (C/6)^b with
a = beta/(alpha+beta), b = alpha/(alpha+beta), G = (alpha A / (beta B))^(1/(alpha+beta)).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from .data import ScalingError, clean, require_distinct
from .objective import HUBER_DELTA, LogLaw, centre, minimise, on_lower_bound_E, uncentre

_WHAT = "Chinchilla fit L(N, D) = E + A/N^alpha + B/D^beta"

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
    Hoffmann's grid (or from `start` alone, as bootstrap resamples do).

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
        theta, _ = minimise(law, centre(starts, shift), delta=delta)
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
    theta, _ = minimise(law, centre(starts, shift), delta=delta)
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
