"""A test-only fit law, registered by the tests that use it (analysis/results/laws): the
pure power law L = A·C^-alpha, no irreducible term, by least squares in log space,

    log L = log A - alpha log C + eps,

with Student-t intervals for A (log-normal) and alpha, and a prediction interval for one
new run. Nothing in scalelab names it: what it shows in `results fit`, its --json and the
report comes from the registry alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats

from scalelab.analysis.results.laws import Law, LawFit, Skipped, VariantTrials
from scalelab.analysis.scaling import Interval


@dataclass(frozen=True)
class PureFit:
    log_a: float
    alpha: float
    cov: np.ndarray  # of (log A, alpha)
    sigma: float  # residual standard deviation of log L
    dof: int


class PurePowerLaw(Law):
    name = "pure_power_law"
    form = "L = A·C^-alpha"
    params = ("A", "alpha")
    label = "pure L(C)"
    title = "Pure power law: L = A·C^-alpha, no irreducible loss (log-space least squares)"

    def fit(self, trials: VariantTrials) -> LawFit | Skipped:
        c, y = trials.column("flops"), trials.losses
        if np.unique(c).size < 3:
            return Skipped("needs 3 or more compute values")
        x, z = np.log(c), np.log(y)
        design = np.column_stack([np.ones_like(x), -x])
        (log_a, alpha), *_ = np.linalg.lstsq(design, z, rcond=None)
        dof = y.size - 2
        residual = z - design @ np.array([log_a, alpha])
        sigma = float(np.sqrt(residual @ residual / dof))
        cov = sigma**2 * np.linalg.inv(design.T @ design)
        fitted = PureFit(float(log_a), float(alpha), cov, sigma, dof)
        t = stats.t.ppf((1 + trials.level) / 2, dof)
        se_a, se_alpha = np.sqrt(np.diag(cov))
        constants = {
            "A": Interval(np.exp(log_a), np.exp(log_a - t * se_a), np.exp(log_a + t * se_a),
                          trials.level),
            "alpha": Interval(alpha, alpha - t * se_alpha, alpha + t * se_alpha, trials.level),
        }  # fmt: skip
        return LawFit(fitted, constants, n_trials=int(y.size))

    def report_lines(self, fit) -> list[str]:
        return [
            f"- {self.label} of {v}: the loss falls {r.constants['alpha'].estimate:.3f}% per "
            "1% more compute at every scale (no floor)"
            for v, r in self.results(fit).items()
        ]

    def predict(self, fitted, *, n_params, tokens, flops, level):
        f = fitted.result
        x = np.log(np.asarray(flops, float))
        mean = f.log_a - f.alpha * x
        grad = np.column_stack([np.ones_like(x), -x])
        se = np.sqrt(np.einsum("ip,pq,iq->i", grad, f.cov, grad) + f.sigma**2)
        half = stats.t.ppf((1 + level) / 2, f.dof) * se
        return np.exp(mean), np.exp(mean - half), np.exp(mean + half)
