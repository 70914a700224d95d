"""Chinchilla's L(N, D) by its one estimator (the Huber fit, chinchilla.py) with what a
forecast needs: the covariance of the constants and a prediction interval calibrated on
the ladder itself (docs/scaling.md, "Forecasts").

Covariance: the Huber fit is an M-estimator, whose asymptotic covariance is
kappa (J'J)^-1 with J the Jacobian of log L_hat at the optimum and
kappa = E[psi(e)^2] / E[psi'(e)]^2 (psi the Huber score), times n / (n - p). kappa is
evaluated for normal errors at the robust scale s = 1.4826 x the median absolute residual
(leaving out the p residuals the fit makes ~0, as a median fit does, and then the points
beyond 4 s, the outliers): s^2 when s << delta
(least squares), pi/2 s^2 when s >> delta (the median regression it then is). Off-law
points inflate neither s nor the covariance.

Calibration (split-conformal style): each size is left out in turn, the law refitted on
the others (warm-started from the full fit, refine.py) and its held-out runs predicted.
The part of each out-of-sample error that the fold's own interval t * sqrt(se^2 + s^2)
does not explain is its excess; the misfit m is the level-quantile (the ceil(n level)-th
smallest) of the excesses over the n points not flagged as outliers. (With split
conformal's ceil((n + 1) level) it is the largest excess on a 25-run ladder, positive in
most exact-law ladders: 97.4% coverage there instead of 96.6%.) A forecast's half-width in log L is

    sqrt((t se)^2 + (t s)^2 + m^2)     parameter uncertainty, one run's scatter, misfit.

Extrapolation (forward chaining): leaving one size out measures interpolation, and a
forecast extrapolates. The law is refitted on the sizes up to each cut (at most
MAX_CUTS cuts, from the third size up) and every larger run is predicted, as a forecast
is. Each scored run gives its error |r| and its distance beyond the fold's data,
delta = log(N / N_max) + log(D / D_max) on the axes where it lies outside (in log,
summed). The error per unit of distance, |r| / delta, has a level-quantile q, and a
target delta beyond the data gets the extrapolation term q delta:

    sqrt((t se)^2 + (t s)^2 + m^2 + (q delta)^2)

q takes the run's whole error, not only what the fold's own interval leaves over: on a
real ladder (Hoffmann et al.'s, docs/scaling.md) the law's errors grow with the distance
faster than its own interval does, and the excess alone covered 10 of 18 held-out runs.

At scale: the folds refit the law on (nearly) every row, one fold per size and one per
cut, O((sizes + cuts) x rows): on 100,000 curve points of 250 runs, ~150 CPU s and ~4.6
GB. Beyond CALIBRATION_ROWS rows the folds (misfit and forward chaining) therefore see a
thinned copy of the rows (`calibration_rows`): every distinct N keeps an equal share,
evenly spread in log D and always with its smallest and largest token count, so the
folds are the same, each keeps its data box and the distances are those of all the
rows; only the rows fitted and scored are fewer. The fit itself, its covariance and scale stay those of every row, and
up to CALIBRATION_ROWS rows nothing changes. What changes beyond is the sample m and q
are read from (and the folds' own fits, on fewer rows, are a little noisier): measured
on ladders both can afford, q and m within ~10% of the folds on every row
(tests/orchestrator/test_fit_scale.py).

Everything is batched over B problems of n rows (a ladder is B = 1; a coverage test
stacks its ladders), rows switched off by a mask.

Why one module: the estimator, its covariance and the interval calibrated on the ladder are
one method: the calibration refits the same estimator fold by fold.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import special, stats

from .bootstrap import Interval
from .chinchilla import ChinchillaFit, fit_chinchilla
from .data import clean
from .objective import _ALPHA_BOUNDS, HUBER_DELTA
from .refine import BATCH_ROWS, predict_and_jacobian, refine

_NAMES = ("E", "A", "B", "alpha", "beta")
MAD_TO_SD = 1.4826  # a normal's standard deviation per median absolute deviation
OUTLIER_Z = 4.0  # |standardised residual| beyond which a point is flagged (checks.py)


MAX_CUTS = 24  # forward-chaining folds at most (spread evenly over the cuts)
CALIBRATION_ROWS = 10_000  # beyond, the folds see this many rows (module doc, "At scale")
SIZE_GAP = 0.02  # runs whose log N differ by less are one size (2%: digitised ladders)


@dataclass(frozen=True)
class Spread:
    """Half-widths in log L of a prediction interval, by source (module doc)."""

    parameter: float  # t * se(log L_hat): the constants' uncertainty at the target
    scatter: float  # t * s: one run's scatter about the law
    misfit: float  # the out-of-sample error the law's own interval does not explain
    extrapolation: float = 0.0  # q * delta: the error forward folds see at this distance
    distance: float = 0.0  # delta: how far beyond the fitted runs, in log N + log D

    @property
    def total(self) -> float:
        beyond = max(self.parameter, self.extrapolation)
        return float(np.sqrt(beyond**2 + self.scatter**2 + self.misfit**2))


@dataclass(frozen=True, eq=False)
class LawStack:
    """B fitted Huber laws: centred log (N, D) X (B, n, 2), log L y (B, n), row mask,
    centred theta (B, p), its covariance (B, p, p) and the robust scale s (B,)."""

    X: np.ndarray
    y: np.ndarray
    mask: np.ndarray
    shift: np.ndarray  # (B, 2)
    theta: np.ndarray
    cov: np.ndarray
    scale: np.ndarray
    has_E: bool

    @property
    def dof(self) -> np.ndarray:
        return self.mask.sum(axis=1) - self.theta.shape[1]

    def t(self, level: float) -> np.ndarray:
        dof = self.dof
        return np.where(dof > 0, stats.t.ppf((1 + level) / 2, np.maximum(dof, 1)), np.nan)

    def residuals(self) -> np.ndarray:
        """log L_hat - log L (B, n); NaN on masked rows."""
        pred, _ = predict_and_jacobian(self.X, self.theta, self.has_E)
        return np.where(self.mask, pred - self.y, np.nan)

    def predict_log(self, n_params: np.ndarray, tokens: np.ndarray):  # noqa: ANN201
        """(log L_hat, its standard error), each (B, m), at (N, D) (B, m)."""
        X = np.stack([np.log(n_params), np.log(tokens)], axis=-1) - self.shift[:, None, :]
        value, var = np.empty(X.shape[:2]), np.empty(X.shape[:2])
        for part in _batches(*X.shape[:2]):  # a (B, m, p) Jacobian at a time is GBs
            value[part], jac = predict_and_jacobian(X[part], self.theta[part], self.has_E)
            var[part] = np.einsum("bip,bpq,biq->bi", jac, self.cov[part], jac)
        return value, np.sqrt(np.maximum(var, 0.0))


def _batches(B: int, n: int) -> list[slice]:
    """Slices of B problems of n rows, BATCH_ROWS rows in all at a time (refine.py)."""
    per = max(1, BATCH_ROWS // max(n, 1))
    return [slice(lo, lo + per) for lo in range(0, B, per)]


def stack_fit(
    n_params: np.ndarray, tokens: np.ndarray, loss: np.ndarray, theta0: np.ndarray, *,
    has_E: bool, mask: np.ndarray | None = None, shift: np.ndarray | None = None,
    refit: bool = True,
) -> LawStack:  # fmt: skip
    """Huber fits of B problems (B, n) refined from raw theta0 (B, p) = [log E?, log A,
    log B, alpha, beta] (refit=False: theta0 is the optimum already), with covariances."""
    mask = np.ones(loss.shape, bool) if mask is None else mask.astype(bool)
    log_x = np.stack([np.log(n_params), np.log(tokens)], axis=-1)
    if shift is None:
        shift = (log_x * mask[..., None]).sum(axis=1) / mask.sum(axis=1)[:, None]
    X = log_x - shift[:, None, :]
    theta = np.array(theta0, dtype=float)
    o = 1 if has_E else 0
    theta[:, o : o + 2] -= theta[:, o + 2 :] * shift  # centre (objective.centre)
    y = np.log(loss)
    if refit:
        theta = refine(X, y, mask, theta, has_E=has_E)
    p = theta.shape[1]
    scale, jtj = np.empty(theta.shape[0]), np.empty((theta.shape[0], p, p))
    for part in _batches(*y.shape):  # B at once held (B, n, p) arrays: GBs in the folds
        pred, jac = predict_and_jacobian(X[part], theta[part], has_E)
        r = np.where(mask[part], pred - y[part], np.nan)
        first = _robust_scale(r, p)
        # again without the outliers it shows (the checks' |z| > OUTLIER_Z): a few off-law
        # runs would otherwise widen every interval (a 12% contamination moves a MAD ~30%)
        scale[part] = _robust_scale(np.where(np.abs(r) > OUTLIER_Z * first[:, None], np.nan, r), p)
        jm = jac * mask[part][..., None]
        jtj[part] = np.einsum("bnp,bnq->bpq", jm, jm)
    n = mask.sum(axis=1)
    dof = n - p
    kappa = np.array([huber_kappa(max(s, 1e-12)) for s in scale])
    with np.errstate(divide="ignore", invalid="ignore"):
        inflate = np.where(dof > 0, kappa * n / dof, np.nan)
    cov = inflate[:, None, None] * np.linalg.pinv(jtj)
    return LawStack(X, y, mask, shift, theta, cov, scale, has_E)


def _robust_scale(r: np.ndarray, p: int) -> np.ndarray:
    """MAD_TO_SD x the median |r| over the rows, less the p smallest (module doc)."""
    a = np.sort(np.abs(r), axis=1)  # NaN (masked) last
    n = np.isfinite(a).sum(axis=1)
    k = np.where(n - p >= 3, p, 0)
    m = n - k
    lo = np.clip(k + (m - 1) // 2, 0, a.shape[1] - 1)
    hi = np.clip(k + m // 2, 0, a.shape[1] - 1)
    rows = np.arange(a.shape[0])
    return MAD_TO_SD * 0.5 * (a[rows, lo] + a[rows, hi])


def huber_kappa(s: float, delta: float = HUBER_DELTA) -> float:
    """E[psi^2] / E[psi']^2 for e ~ N(0, s^2) and the Huber score psi (module doc)."""
    c = delta / s
    inside = special.erf(c / np.sqrt(2))  # P(|e| <= delta)
    psi2 = s**2 * (inside - 2 * c * stats.norm.pdf(c)) + delta**2 * (1 - inside)
    return float(psi2 / max(inside, 1e-300) ** 2)


SCALE_FLOOR = 1e-4  # a law exact to 0.01% has no outliers worth the name


def outliers(stack: LawStack) -> np.ndarray:
    """(B, n): rows whose standardised residual r / s is beyond OUTLIER_Z."""
    z = stack.residuals() / np.maximum(stack.scale, SCALE_FLOOR)[:, None]
    return np.abs(np.nan_to_num(z)) > OUTLIER_Z


def misfit(stack: LawStack, n_params: np.ndarray, tokens: np.ndarray, *, level: float = 0.95,
           exclude: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
    """Leave-one-size-out misfit m (B,) of each fitted law (module doc), with the number
    of folds and of points scored. `exclude` (B, n) marks rows (outliers) that stay in the
    fits but are not scored (default: `outliers(stack)`). A fold whose remaining rows cannot support the law (< 3 sizes
    or token counts, no degree of freedom) is skipped."""
    B, n = stack.y.shape
    p = stack.theta.shape[1]
    exclude = outliers(stack) if exclude is None else exclude.astype(bool)
    scored = stack.mask & ~exclude
    keeps, helds, owner = [], [], []
    for b in range(B):
        on = stack.mask[b]
        for size in np.unique(n_params[b][on]):
            held = on & (n_params[b] == size)
            keep = on & ~held
            if (np.unique(n_params[b][keep]).size < 3 or np.unique(tokens[b][keep]).size < 3
                    or keep.sum() <= p):  # fmt: skip
                continue
            keeps.append(keep)
            helds.append(held)
            owner.append(b)
    folds = np.bincount(owner, minlength=B) if owner else np.zeros(B, int)
    if not owner:
        return np.zeros(B), folds, np.zeros(B, int)
    idx = np.array(owner)
    keep, held = np.array(keeps), np.array(helds)
    # the folds keep the full fit's centring, so its theta is their warm start as it is
    raw = stack.theta[idx].copy()
    o = 1 if stack.has_E else 0
    raw[:, o : o + 2] += raw[:, o + 2 :] * stack.shift[idx]
    fold = stack_fit(np.exp(stack.X[idx, :, 0] + stack.shift[idx, None, 0]),
                     np.exp(stack.X[idx, :, 1] + stack.shift[idx, None, 1]),
                     np.exp(stack.y[idx]), raw, has_E=stack.has_E, mask=keep,
                     shift=stack.shift[idx])  # fmt: skip
    mean, se = fold.predict_log(n_params[idx], tokens[idx])
    r = np.log(np.exp(stack.y[idx])) - mean
    own = fold.t(level)[:, None] * np.sqrt(se**2 + fold.scale[:, None] ** 2)
    excess = np.where(held & scored[idx], np.sqrt(np.maximum(r**2 - own**2, 0.0)), np.nan)
    out = np.zeros(B)
    counts = np.zeros(B, int)
    for b in range(B):
        scores = np.sort(excess[idx == b][np.isfinite(excess[idx == b])])
        counts[b] = scores.size
        if scores.size:
            rank = min(int(np.ceil(scores.size * level)), scores.size)
            out[b] = scores[rank - 1]
    return out, folds, counts


def size_groups(log_n: np.ndarray) -> np.ndarray:
    """Each run's size as an index 0, 1, ... in increasing N: runs whose sorted log N lie
    within SIZE_GAP of the previous one share it (a digitised ladder's 73.824671M and
    73.824689M are one size)."""
    order = np.argsort(log_n, kind="stable")
    groups = np.empty(log_n.size, int)
    groups[order] = np.concatenate([[0], np.cumsum(np.diff(log_n[order]) > SIZE_GAP)])
    return groups


def distance_beyond(log_n: np.ndarray, log_d: np.ndarray, box: np.ndarray) -> np.ndarray:
    """delta (module doc): how far (log N, log D) lie outside box = [[N lo, N hi], [D lo,
    D hi]] in log, summed over the two axes; 0 inside. Broadcasts box (..., 2, 2)."""
    out = np.zeros(np.broadcast_shapes(log_n.shape, box.shape[:-2] + (1,)))
    for axis, x in enumerate((log_n, log_d)):
        lo, hi = box[..., axis, 0, None], box[..., axis, 1, None]
        out = out + np.maximum(x - hi, 0.0) + np.maximum(lo - x, 0.0)
    return out


def data_box(log_n: np.ndarray, log_d: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """(B, 2, 2): the fitted rows' log N and log D ranges, per problem."""

    def span(x: np.ndarray) -> np.ndarray:
        return np.stack([np.where(mask, x, np.inf).min(axis=1),
                         np.where(mask, x, -np.inf).max(axis=1)], axis=-1)  # fmt: skip

    return np.stack([span(log_n), span(log_d)], axis=1)


@dataclass(frozen=True)
class Reach:
    """What forward chaining measured on one ladder (module doc): the scored runs'
    distances beyond their fold's data and their absolute errors in log L."""

    distance: np.ndarray
    error: np.ndarray
    n_folds: int

    def per_distance(self, level: float) -> float:
        """q: the level-quantile of error / distance (NaN with no scored run)."""
        if self.distance.size == 0:
            return float("nan")
        score = np.sort(self.error / self.distance)
        return float(score[min(int(np.ceil(score.size * level)), score.size) - 1])


def forward_folds(stack: LawStack, n_params: np.ndarray, tokens: np.ndarray, *,
                  exclude: np.ndarray | None = None) -> list[Reach]:  # fmt: skip
    """Forward-chaining folds of each fitted law (module doc): refit on the sizes up to a
    cut, score every larger run not marked in `exclude` (default: `outliers(stack)`)."""
    B = stack.y.shape[0]
    p = stack.theta.shape[1]
    exclude = outliers(stack) if exclude is None else exclude.astype(bool)
    log_n, log_d = np.log(n_params), np.log(tokens)
    keeps, owner = [], []
    for b in range(B):
        on = stack.mask[b]
        groups = np.where(on, size_groups(np.where(on, log_n[b], np.inf)), -1)
        cuts = np.unique(groups[on])[2:-1]
        if cuts.size > MAX_CUTS:
            cuts = cuts[np.unique(np.linspace(0, cuts.size - 1, MAX_CUTS).round().astype(int))]
        for cut in cuts:
            keep = on & (groups <= cut)
            if np.unique(tokens[b][keep]).size >= 3 and keep.sum() > p:
                keeps.append(keep)
                owner.append(b)
    if not owner:
        return [Reach(np.zeros(0), np.zeros(0), 0) for _ in range(B)]
    idx, keep = np.array(owner), np.array(keeps)
    raw = stack.theta[idx].copy()  # the full fit, uncentred: every fold's warm start
    o = 1 if stack.has_E else 0
    raw[:, o : o + 2] += raw[:, o + 2 :] * stack.shift[idx]
    loss = np.exp(stack.y[idx])
    fold = stack_fit(n_params[idx], tokens[idx], loss, raw, has_E=stack.has_E, mask=keep,
                     shift=stack.shift[idx])  # fmt: skip
    mean, _ = fold.predict_log(n_params[idx], tokens[idx])
    delta = distance_beyond(log_n[idx], log_d[idx], data_box(log_n[idx], log_d[idx], keep))
    scored = stack.mask[idx] & ~keep & ~exclude[idx] & (delta > 0)
    error = np.abs(stack.y[idx] - mean)
    return [
        Reach(
            delta[scored & (idx == b)[:, None]],
            error[scored & (idx == b)[:, None]],
            int((idx == b).sum()),
        )  # fmt: skip
        for b in range(B)
    ]


@dataclass(frozen=True, eq=False)
class RobustLaw:
    """One ladder's Huber Chinchilla fit, its covariance and its misfit (module doc)."""

    fit: ChinchillaFit
    stack: LawStack  # B = 1
    n_folds: int = 0
    n_scored: int = 0
    misfit: float = 0.0  # m in log L, at `level`
    level: float = 0.95
    covariates: tuple[str, ...] = ("N", "D")
    reach: Reach | None = None  # the forward-chaining folds (None: not measured)
    calibrated_on: int = 0  # rows the folds saw, when thinned (calibration_rows); 0: all

    @property
    def per_distance(self) -> float:
        """q (module doc): NaN when no forward fold could be made."""
        return float("nan") if self.reach is None else self.reach.per_distance(self.level)

    def distance(self, n_params: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        """delta of each (N, D) beyond the fitted runs (module doc)."""
        s = self.stack
        box = data_box(s.X[..., 0] + s.shift[:, None, 0], s.X[..., 1] + s.shift[:, None, 1],
                       s.mask)[0]  # fmt: skip
        return distance_beyond(np.log(n_params), np.log(tokens), box)

    @property
    def has_E(self) -> bool:
        return self.fit.has_E

    @property
    def fallback(self) -> str:
        return self.fit.fallback

    @property
    def form(self) -> str:
        return self.fit.form

    @property
    def scale(self) -> float:
        return float(self.stack.scale[0])

    @property
    def dof(self) -> int:
        return int(self.stack.dof[0])

    def values(self) -> dict[str, float]:
        return self.fit.values()

    def predict(self, n_params: np.ndarray | float, tokens: np.ndarray | float) -> np.ndarray:
        return self.fit.predict(n_params, tokens)

    def residuals(self) -> np.ndarray:
        return self.stack.residuals()[0]

    def prediction(self, n_params, tokens, level: float = 0.95):  # noqa: ANN001, ANN201
        """(L_hat, low, high, spreads) for one new run at each (N, D) (module doc). The
        misfit was measured at the calibration's level and is used at that level."""
        n = np.atleast_1d(np.asarray(n_params, float))[None]
        d = np.atleast_1d(np.asarray(tokens, float))[None]
        mean, se = self.stack.predict_log(n, d)
        t = float(self.stack.t(level)[0])
        delta = self.distance(n[0], d[0])
        q = self.per_distance
        q = 0.0 if np.isnan(q) else q  # no fold: said by the forecast's notes
        spreads = [Spread(float(t * s), t * self.scale, self.misfit, float(q * x), float(x))
                   for s, x in zip(se[0], delta, strict=True)]  # fmt: skip
        half = np.array([s.total for s in spreads])
        return np.exp(mean[0]), np.exp(mean[0] - half), np.exp(mean[0] + half), spreads

    def intervals(self, level: float = 0.95) -> dict[str, Interval]:
        """Delta-method t intervals: E, A, B log-normal, the exponents clipped to [0, 10]."""
        t = float(self.stack.t(level)[0])
        cov, shift = self.stack.cov[0], self.stack.shift[0]
        p = cov.shape[0]
        o = p - 4
        eye = np.eye(p)
        grads = {"A": eye[o] + shift[0] * eye[o + 2], "B": eye[o + 1] + shift[1] * eye[o + 3]}
        if self.has_E:
            grads["E"] = eye[0]
        out = {"E": Interval(0.0, 0.0, 0.0, level)}
        for name, g in grads.items():
            value = float(np.log(getattr(self.fit, name)))
            se = float(np.sqrt(max(g @ cov @ g, 0.0)))
            out[name] = Interval(np.exp(value), np.exp(value - t * se), np.exp(value + t * se),
                                 level)  # fmt: skip
        low, high = _ALPHA_BOUNDS
        for j, name in enumerate(("alpha", "beta")):
            se = float(np.sqrt(max(cov[o + 2 + j, o + 2 + j], 0.0)))
            v = getattr(self.fit, name)
            out[name] = Interval(v, max(v - t * se, low), min(v + t * se, high), level)
        return {k: out[k] for k in _NAMES}


def raw_theta(fit: ChinchillaFit) -> np.ndarray:
    head = [np.log(fit.E)] if fit.has_E else []
    return np.array(head + [np.log(fit.A), np.log(fit.B), fit.alpha, fit.beta])


def robust_law(
    n_params: np.ndarray, tokens: np.ndarray, loss: np.ndarray, *, level: float = 0.95,
    fit: ChinchillaFit | None = None, exclude: np.ndarray | None = None,
) -> RobustLaw:  # fmt: skip
    """fit_chinchilla through the points (or `fit`, made on them already), its covariance
    and its leave-one-size-out misfit at `level`; `exclude` marks outliers (fitted, not
    scored; by default those of `outliers`)."""
    y, xs = clean(loss, {"n_params": n_params, "tokens": tokens}, what="robust L(N, D)")
    n, d = xs["n_params"], xs["tokens"]
    if fit is None:
        fit = fit_chinchilla(n, d, y)
    stack = stack_fit(n[None], d[None], y[None], raw_theta(fit)[None], has_E=fit.has_E,
                      refit=False)  # fmt: skip
    ex = None if exclude is None else np.asarray(exclude, bool)[None]
    rows = calibration_rows(np.log(n), np.log(d))
    cal, cn, cd = stack, n, d
    if rows is not None:  # the folds on a thinned copy (module doc, "At scale")
        ex = (outliers(stack) if ex is None else ex)[:, rows]
        cn, cd = n[rows], d[rows]
        cal = stack_fit(cn[None], cd[None], y[rows][None], raw_theta(fit)[None],
                        has_E=fit.has_E, shift=stack.shift, refit=False)  # fmt: skip
    m, folds, scored = misfit(cal, cn[None], cd[None], level=level, exclude=ex)
    reach = forward_folds(cal, cn[None], cd[None], exclude=ex)[0]
    return RobustLaw(fit, stack, int(folds[0]), int(scored[0]), float(m[0]), level,
                     reach=reach if reach.n_folds else None,
                     calibrated_on=0 if rows is None else int(rows.size))  # fmt: skip


def calibration_rows(log_n: np.ndarray, log_d: np.ndarray,
                     cap: int | None = None) -> np.ndarray | None:  # fmt: skip
    """None up to `cap` (default CALIBRATION_ROWS) rows: the folds see them all; beyond,
    the sorted indices of the rows they see: every distinct N (a run's curve, or the
    runs of one size) keeps ceil(cap / sizes) of its rows, at least 2 (all of them when
    it has fewer), evenly spread in log D from its smallest to its largest token count,
    so the folds have every size and each size's token range of all the rows (module
    doc, "At scale")."""
    cap = CALIBRATION_ROWS if cap is None else cap
    if log_n.size <= cap:
        return None
    groups = np.unique(log_n, return_inverse=True)[1].ravel()
    order = np.lexsort((log_d, groups))
    counts = np.bincount(groups)
    per = max(2, -(-cap // counts.size))
    first = np.r_[0, np.cumsum(counts)[:-1]]
    picks = [order[lo + np.linspace(0, c - 1, min(c, per)).round().astype(int)]
             for lo, c in zip(first, counts, strict=True)]  # fmt: skip
    return np.sort(np.concatenate(picks))
