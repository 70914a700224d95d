"""Downstream task accuracy of a larger run, forecast from a ladder (docs/evaluation.md,
"Forecasting task accuracy"). Two laws, each with a prediction interval:

- two-step (Bhagia et al. 2024; the Llama 3 report): step 1, the task's correct-answer
  loss L (bits per byte or nll of the correct continuation; the validation loss when the
  task has none) as a power law in compute through the ladder's runs, log L = l0 - beta
  log C; step 2, accuracy as a sigmoid of that loss through every run that has both,
  acc = b + a / (1 + exp(k (L - L0))) with k > 0 and b at least the task's chance level.
  The forecast chains them: acc(C) = sigmoid(L(C)).
- direct (Krajewski et al. 2025): at a fixed number of tokens per parameter,
  -log acc = A C^-alpha, a straight line in log(-log acc) against log C.

Interval: the runs are resampled with replacement (B resamples, each law refitted: step 1
and step 2 on their own runs) and the spread of the resampled forecasts is the law's
uncertainty at the target; one run's scatter about the law (the residual variance, on n -
p degrees of freedom) is added, and the half-width is t(n - p) sqrt(var_boot + scatter^2)
on the law's own scale (accuracy for two-step, log(-log acc) for direct). For two-step
the scatter is step 2's residual plus step 1's scatter carried through the sigmoid's
slope at the forecast loss. A percentile interval of the resamples alone leaves out the
new run's own scatter and, on 6-8 sizes, covers less than its level.

Refusal (`TaskForecastError`, one line, no number): accuracy indistinguishable from
chance at all but one of the ladder's sizes (a one-sided z test of each size's mean
accuracy against chance at 1%, with lm-eval's standard error of the accuracy), or a fitted
sigmoid whose rise across the data's losses is under twice its own scatter: there is no
trend to extrapolate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from scipy import optimize, stats

from .data import ScalingError

# chance accuracy of lm-eval's zero-shot tasks (1 / choices); open-ended tasks 0
CHANCE: dict[str, float] = {
    "piqa": 0.5, "winogrande": 0.5, "boolq": 0.5, "copa": 0.5, "wsc": 0.5, "wsc273": 0.5,
    "blimp": 0.5, "arc_easy": 0.25, "arc_challenge": 0.25, "hellaswag": 0.25, "sciq": 0.25,
    "openbookqa": 0.25, "logiqa": 0.25, "mmlu": 0.25, "scalelab_zen": 0.25,
    "lambada_openai": 0.0, "lambada_standard": 0.0,
}  # fmt: skip
N_RESAMPLES = 200
CHANCE_Z = float(stats.norm.ppf(0.99))  # one-sided 1% test of a size's accuracy vs chance
MIN_SIZES_ABOVE = 2  # a trend needs two sizes above chance
RISE_SCATTERS = 2.0  # a sigmoid whose rise over the data is under 2 scatters has none


class TaskForecastError(ScalingError):
    """No forecast: the message says why, in one line."""


@dataclass(frozen=True)
class TaskPrediction:
    acc: float
    low: float
    high: float
    level: float

    def __contains__(self, value: float) -> bool:
        return bool(self.low <= value <= self.high)


@dataclass(frozen=True)
class TaskLaw:
    """A fitted law and its resampled refits; `predict` gives accuracy at compute C."""

    method: str  # "two-step" or "direct"
    form: str
    constants: dict[str, float]
    n_runs: int  # the runs the compute law went through (step 1, or the direct law)
    df: int  # degrees of freedom of the interval's t quantile
    scatter: float  # one run's scatter about the law, on its own scale
    boot: np.ndarray = field(repr=False)  # (B, p) the resampled refits' constants
    chance: float = 0.0
    n_sigmoid: int = 0  # two-step: the runs step 2 went through
    sigmoid_scatter: float = 0.0  # two-step: step 2's residual scatter, in accuracy

    def predict(self, c: np.ndarray | list[float], level: float = 0.95) -> list[TaskPrediction]:
        x = np.log(np.asarray(c, float))
        t = float(stats.t.ppf((1 + level) / 2, self.df))
        if self.method == "direct":
            a0, alpha = self.constants["logA"], self.constants["alpha"]
            z = a0 - alpha * x
            zb = self.boot[:, :1] - self.boot[:, 1:2] * x[None, :]
            acc = _from_z(z)
            scatter2 = self.scatter**2 * _z_variance(acc)
            half = t * np.sqrt(np.var(zb, axis=0, ddof=1) + scatter2)
            lo, hi = _from_z(z + half), _from_z(z - half)
        else:
            p = self.constants
            sig = (p["a"], p["b"], p["k"], p["L0"])
            loss = np.exp(p["l0"] - p["beta"] * x)
            acc = _sigmoid(loss, *sig)
            # step 1's part (its refits through the point sigmoid, its scatter through the
            # sigmoid's slope) and step 2's (its refits at the point loss, its scatter),
            # their t quantile on Welch-Satterthwaite's degrees of freedom
            boot_loss = np.exp(self.boot[:, :1] - self.boot[:, 1:2] * x[None, :])
            slope = _sigmoid_slope(loss, p["a"], p["k"], p["L0"]) * loss  # d acc / d log L
            v1 = np.var(_sigmoid(boot_loss, *sig), axis=0, ddof=1) + (slope * self.scatter) ** 2
            boot_sig = (self.boot[:, i : i + 1] for i in range(2, 6))
            v2 = np.var(_sigmoid(loss[None, :], *boot_sig), axis=0, ddof=1)
            v2 = v2 + self.sigmoid_scatter**2
            df2 = max(self.n_sigmoid - 4, 1)
            df = (v1 + v2) ** 2 / np.maximum(v1**2 / self.df + v2**2 / df2, 1e-300)
            half = stats.t.ppf((1 + level) / 2, df) * np.sqrt(v1 + v2)
            lo, hi = np.clip(acc - half, 0, 1), np.clip(acc + half, 0, 1)
        return [TaskPrediction(float(a), float(lo_), float(hi_), level)
                for a, lo_, hi_ in zip(acc, lo, hi, strict=True)]  # fmt: skip


def _from_z(z: np.ndarray) -> np.ndarray:
    """accuracy from z = log(-log acc)."""
    return np.exp(-np.exp(z))


def _sigmoid(loss: np.ndarray, a, b, k, l0) -> np.ndarray:  # noqa: ANN001
    return b + a / (1 + np.exp(np.clip(k * (loss - l0), -50, 50)))


def _sigmoid_slope(loss: np.ndarray, a: float, k: float, l0: float) -> np.ndarray:
    e = np.exp(np.clip(k * (loss - l0), -50, 50))
    return -a * k * e / (1 + e) ** 2


def _batched_line(x: np.ndarray, y: np.ndarray, counts: np.ndarray, w: np.ndarray) -> np.ndarray:
    """(B, 2) intercept and minus slope of the weighted least-squares line of y on x, one
    per row of `counts` (how often each run is drawn); NaN where a resample has one x."""
    cw = counts * w[None, :]
    total = cw.sum(axis=1, keepdims=True)
    xm, ym = (
        (cw * x).sum(axis=1, keepdims=True) / total,
        (cw * y).sum(axis=1, keepdims=True) / total,
    )
    sxx = (cw * (x - xm) ** 2).sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        slope = (cw * (x - xm) * (y - ym)).sum(axis=1) / np.where(
            sxx > 1e-12 * total[:, 0], sxx, np.nan
        )
    return np.column_stack([ym[:, 0] - slope * xm[:, 0], -slope])


def _line(x: np.ndarray, y: np.ndarray, w: np.ndarray) -> tuple[float, float, float]:
    """intercept, minus slope, and the residual scatter of a run of weight 1 (n - 2
    degrees of freedom)."""
    a0, neg = _batched_line(x, y, np.ones((1, x.size)), w)[0]
    resid = y - (a0 - neg * x)
    return float(a0), float(neg), float(np.sqrt((w * resid**2).sum() / max(x.size - 2, 1)))


def _counts(rng: np.random.Generator, n: int, n_resamples: int) -> np.ndarray:
    """(B, n): how often each of n runs is drawn in each of B resamples with replacement."""
    idx = rng.integers(0, n, (n_resamples, n))
    out = np.zeros((n_resamples, n))
    np.add.at(out, (np.arange(n_resamples)[:, None], idx), 1.0)
    return out


def _z_variance(acc: np.ndarray) -> np.ndarray:
    """The shape of a binomial accuracy's variance on the scale z = log(-log acc) (delta
    method; its scale is fitted): acc (1 - acc) / (acc log acc)^2."""
    return (1 - acc) / (acc * np.log(acc) ** 2)


def _check(c: np.ndarray, what: str, min_points: int = 3) -> None:
    if np.unique(c).size < min_points:
        raise ScalingError(
            f"{what}: needs runs at {min_points} or more compute budgets, got {np.unique(c).size}"
        )


def fit_direct(
    c: np.ndarray, acc: np.ndarray, *, n_resamples: int = N_RESAMPLES, seed: int = 0
) -> TaskLaw:
    """-log acc = A C^-alpha through these runs (module doc), with B resampled refits."""
    c, acc = np.asarray(c, float), np.asarray(acc, float)
    _check(c, "direct law")
    if np.any((acc <= 0) | (acc >= 1)):
        raise ScalingError("direct law: accuracies must lie strictly between 0 and 1")
    x, z, w = np.log(c), np.log(-np.log(acc)), 1 / _z_variance(acc)
    a0, alpha, s = _line(x, z, w)
    counts = _counts(np.random.default_rng(seed), x.size, n_resamples)
    boot = _batched_line(x, z, counts, w)
    boot = boot[np.isfinite(boot).all(axis=1)]
    return TaskLaw("direct", "-log acc = A C^-alpha", {"logA": a0, "alpha": alpha},
                   x.size, x.size - 2, s, boot)  # fmt: skip


def fit_sigmoid(
    loss: np.ndarray, acc: np.ndarray, chance: float, start: np.ndarray | None = None
) -> np.ndarray:
    """(a, b, k, L0) of acc = b + a / (1 + exp(k (L - L0))), b >= chance, by scipy's
    bounded least squares (from `start`, else from a few starting L0)."""
    lo_b = max(chance, 0.0)
    top = max(1.0 - lo_b, 1e-6)
    bounds = ([0.0, lo_b, 1e-6, -np.inf], [top, 1.0, np.inf, np.inf])
    span = max(float(np.ptp(loss)), 1e-3)

    def resid(p: np.ndarray) -> np.ndarray:
        return _sigmoid(loss, *p) - acc

    starts = (
        [start]
        if start is not None
        else [
            np.array([max(acc.max() - lo_b, 1e-3) * 1.2, lo_b, 4.0 / span, q])
            for q in np.quantile(loss, [0.2, 0.5, 0.8])
        ]
    )
    best = None
    for p0 in starts:
        p0 = np.clip(p0, np.array(bounds[0]) + 1e-9, np.array(bounds[1]) - 1e-9)
        r = optimize.least_squares(resid, p0, bounds=bounds, method="trf", max_nfev=200)
        if best is None or r.cost < best.cost:
            best = r
    assert best is not None
    return best.x


def fit_two_step(
    c: np.ndarray, loss: np.ndarray, run_loss: np.ndarray, run_acc: np.ndarray,
    *, chance: float = 0.0, n_resamples: int = N_RESAMPLES, seed: int = 0,
) -> TaskLaw:  # fmt: skip
    """Step 1 through (c, loss), the ladder's runs; step 2 through (run_loss, run_acc),
    every run with both (module doc); each refitted on B resamples of its own runs."""
    c, loss = np.asarray(c, float), np.asarray(loss, float)
    run_loss, run_acc = np.asarray(run_loss, float), np.asarray(run_acc, float)
    _check(c, "two-step law, step 1")
    if run_loss.size < 6:
        raise ScalingError(f"two-step law, step 2: needs 6 or more runs, got {run_loss.size}")
    x, y = np.log(c), np.log(loss)
    l0, beta, s = _line(x, y, np.ones(x.size))
    sig = fit_sigmoid(run_loss, run_acc, chance)
    s_acc = float(np.sqrt(((_sigmoid(run_loss, *sig) - run_acc) ** 2).sum()
                          / max(run_loss.size - 4, 1)))  # fmt: skip
    rise = float(_sigmoid(run_loss.min(), *sig) - _sigmoid(run_loss.max(), *sig))
    if rise < RISE_SCATTERS * s_acc:
        raise TaskForecastError(
            "the sigmoid of accuracy on loss does not rise inside the data (its rise is under "
            "twice the runs' scatter): no trend to extrapolate"
        )
    rng = np.random.default_rng(seed)
    step1 = _batched_line(x, y, _counts(rng, x.size, n_resamples), np.ones(x.size))
    counts2 = _counts(rng, run_loss.size, n_resamples)
    step2 = _linearised_refits(run_loss, run_acc, sig, counts2, chance)
    step2[:, 1] = np.maximum(step2[:, 1], chance)
    boot = np.column_stack([step1, step2])
    boot = boot[np.isfinite(boot).all(axis=1)]
    constants = {"l0": l0, "beta": beta, "a": sig[0], "b": sig[1], "k": sig[2], "L0": sig[3]}
    return TaskLaw("two-step", "L = exp(l0) C^-beta; acc = b + a / (1 + exp(k (L - L0)))",
                   constants, x.size, x.size - 2, s, boot, chance, run_loss.size,
                   s_acc)  # fmt: skip


def _linearised_refits(
    loss: np.ndarray, acc: np.ndarray, p: np.ndarray, counts: np.ndarray, chance: float
) -> np.ndarray:
    """(B, 4) the sigmoid refitted to each resample (`counts`), linearised at the point fit
    `p`: one Gauss-Newton step of the weighted problem, as `results fit` refits a Huber
    law on many rows (bootstrap.linearised_bootstrap). A constant the point fit left at
    its bound (b at chance, a at 1 - chance: the data do not reach that asymptote) stays
    there; the others move."""
    a, b, k, l0 = p
    s = 1 / (1 + np.exp(np.clip(k * (loss - l0), -50, 50)))
    ds = s * (1 - s)
    jac = np.column_stack([s, np.ones_like(s), -a * ds * (loss - l0), a * k * ds])
    free = np.array([a < (1 - max(chance, 0.0)) - 1e-6, b > max(chance, 0.0) + 1e-6, True, True])
    jac = jac[:, free]
    resid = acc - _sigmoid(loss, *p)
    jtj = np.einsum("bn,ni,nj->bij", counts, jac, jac)
    jtr = np.einsum("bn,ni,n->bi", counts, jac, resid)
    ridge = 1e-10 * np.trace(jac.T @ jac) * np.eye(int(free.sum()))
    out = np.tile(p, (counts.shape[0], 1))
    out[:, free] += np.linalg.solve(jtj + ridge, jtr[..., None])[..., 0]
    return out


def chance_refusal(
    sizes: np.ndarray, acc: np.ndarray, stderr: np.ndarray | None, chance: float | None
) -> str | None:
    """Why the ladder's accuracies give no trend (module doc), or None. `stderr`: each
    run's standard error of its accuracy (None or NaN where unknown: no test)."""
    if chance is None or stderr is None or not np.isfinite(stderr).all():
        return None
    above = 0
    labels = list(dict.fromkeys(sizes.tolist()))
    for size in labels:
        m = sizes == size
        se = math.sqrt(float((stderr[m] ** 2).sum())) / m.sum()
        if se > 0 and (acc[m].mean() - chance) / se > CHANCE_Z:
            above += 1
    if above < MIN_SIZES_ABOVE:
        return (
            f"accuracy is at chance ({chance:g}) on {len(labels) - above} of the ladder's "
            f"{len(labels)} sizes (one-sided 1% test): no trend to extrapolate"
        )
    return None
