"""The paired compute-equivalent gain: trials that differ only in the variant, compared
pair by pair.

A pair is a variant trial and a baseline trial with the same cell and seed (cells.py).
Model, with L_b(C) = E + A C^-alpha the baseline's law through all its trials:

    log L_baseline,i = log L_b(C_b,i)     + delta_cell + eps_i
    log L_variant,i  = log L_b(C_v,i / m) + delta_cell + eps'_i

delta_cell is whatever makes a cell sit off the law (its N/D allocation, an unlucky data
order of its seed): it is shared by the two trials of a pair and cancels in their
difference d_i = log L_variant,i - log L_baseline,i. To first order in d_i,

    log m_i = log(C_v,i / C_b,i) + d_i / s_i,     s_i = -d log L_b / d log C at C_b,i

(s_i, the law's elasticity, converts a loss difference into a compute ratio). The
estimate is the precision-weighted mean log m = sum w_i log m_i / sum w_i with w_i = s_i^2
(var(d_i) is the same for every pair, so var(log m_i) is proportional to 1/s_i^2); its
variance is sigma^2 / sum w_i with sigma^2 = sum w_i (log m_i - log m)^2 / (n - 1), plus the
law's share through s (delta method on the law's covariance, lsq.py). The interval is
Student-t with n - 1 degrees of freedom. Far tighter than comparing two fitted laws when
the cells scatter about the law more than the pairs differ, as they do in small sweeps.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats

from .bootstrap import Interval
from .cells import Pairs
from .data import ScalingError
from .lsq import LsqFit


@dataclass(frozen=True, eq=False)
class PairedGain:
    variant: str
    baseline: str
    multiplier: Interval  # m: the variant reaches the baseline's loss with m x its FLOPs
    loss_ratio: Interval  # geometric mean of L_variant / L_baseline over the pairs
    log_m: np.ndarray  # per pair
    weights: np.ndarray  # s_i^2 per pair
    sigma: float  # scatter of one unit-weight pair's log m (= of d_i), n - 1 dof
    se_pairs: float  # standard error of log m from the pairs' scatter
    se_law: float  # ... from the uncertainty of the baseline law's slope
    n_pairs: int
    n_cells: int
    pairs: Pairs

    @property
    def dof(self) -> int:
        return self.n_pairs - 1

    @property
    def se(self) -> float:
        return float(np.hypot(self.se_pairs, self.se_law))

    def __str__(self) -> str:
        m = self.multiplier
        return (
            f"{self.variant} reaches the {self.baseline} loss at {m.estimate:.2f}× the FLOPs "
            f"(paired over {self.n_pairs} trial pairs), {m.level:.0%} CI "
            f"[{m.low:.2f}, {m.high:.2f}]"
        )


MIN_SLOPE = 1e-6  # -d log L / d log C below this: the loss does not fall with compute


def paired_gain(pairs: Pairs, law: LsqFit, *, level: float = 0.95) -> PairedGain:
    """The paired estimate of the compute multiplier (module doc). `law` is the baseline's
    L(C) (lsq.lsq_power_law on its trials). Needs two or more pairs."""
    if pairs.n < 2:
        raise ScalingError(
            f"paired gain of {pairs.variant!r}: needs 2 or more trial pairs (same cell and "
            f"seed), got {pairs.n}"
        )
    if law.covariates != ("C",):
        raise ScalingError("paired gain: the baseline law must be L(C)")
    d = pairs.log_diff
    ratio = np.log(pairs.flops / pairs.baseline_flops)
    # the law's exponent is bounded at 0: a loss that rises with compute fits a slope of 0,
    # through which any loss difference would be an infinite (or zero) compute multiplier
    if np.any(_elasticity(law, law.theta, pairs.baseline_flops) < MIN_SLOPE):
        raise ScalingError(
            f"paired gain of {pairs.variant!r}: the {pairs.baseline}'s loss does not fall with "
            "compute across its cells (its fitted log-log slope is 0), so a loss difference "
            "cannot be turned into compute; compare the losses per cell (more tokens per "
            "parameter, or more sizes, bring the runs into the power-law regime)"
        )

    def estimate(theta: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
        s = _elasticity(law, theta, pairs.baseline_flops)
        log_m = ratio + d / s
        w = s**2
        return float(w @ log_m / w.sum()), log_m, w

    mean, log_m, w = estimate(law.theta)
    if not np.all(w > 0):
        raise ScalingError(
            f"paired gain of {pairs.variant!r}: the baseline law is flat (zero slope) where "
            "the pairs are; a loss difference cannot be turned into compute"
        )
    n = pairs.n
    sigma = float(np.sqrt(w @ (log_m - mean) ** 2 / (n - 1)))
    se_pairs = sigma / float(np.sqrt(w.sum()))
    se_law = _law_share(estimate, law)
    se = float(np.hypot(se_pairs, se_law))
    t = float(stats.t.ppf((1 + level) / 2, n - 1))
    multiplier = Interval(
        float(np.exp(mean)), float(np.exp(mean - t * se)), float(np.exp(mean + t * se)), level
    )
    d_mean, d_se = float(d.mean()), float(d.std(ddof=1) / np.sqrt(n))
    loss_ratio = Interval(
        float(np.exp(d_mean)), float(np.exp(d_mean - t * d_se)), float(np.exp(d_mean + t * d_se)),
        level,
    )  # fmt: skip
    return PairedGain(
        variant=pairs.variant,
        baseline=pairs.baseline,
        multiplier=multiplier,
        loss_ratio=loss_ratio,
        log_m=log_m,
        weights=w,
        sigma=sigma,
        se_pairs=se_pairs,
        se_law=se_law,
        n_pairs=n,
        n_cells=len(set(pairs.cells)),
        pairs=pairs,
    )


def _elasticity(law: LsqFit, theta: np.ndarray, flops: np.ndarray) -> np.ndarray:
    """-d log L / d log C of the law with constants theta, at each compute."""
    x = np.log(flops)[:, None] - law.shift
    o = law.law.offset
    z = theta[o] - theta[o + 1] * x[:, 0]
    if not law.has_E:
        return np.full(flops.shape, theta[o + 1])
    share = 1.0 / (1.0 + np.exp(theta[0] - z))  # A C^-alpha / L: the reducible share
    return share * theta[o + 1]


def _law_share(estimate, law: LsqFit) -> float:  # noqa: ANN001
    """Delta method: the standard error log m inherits from the law's constants."""
    if not np.all(np.isfinite(law.cov)):
        return 0.0  # a law without degrees of freedom: the pairs' scatter is all we have
    base = estimate(law.theta)[0]
    grad = np.empty(law.theta.size)
    for j in range(law.theta.size):
        step = 1e-6 * max(1.0, abs(law.theta[j]))
        theta = law.theta.copy()
        theta[j] += step
        grad[j] = (estimate(theta)[0] - base) / step
    return float(np.sqrt(max(grad @ law.cov @ grad, 0.0)))
