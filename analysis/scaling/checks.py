"""Does a fitted law describe its points? Constants on a bound, the fallback to a simpler
law, residuals, and whether the points lie in the power-law regime.

Checks on a law L(C) fitted to points (C_i, L_i):

- a constant on a bound: E at 0 (objective.on_lower_bound_E; the fits then fall back to
  the law without E and say why), E at the lowest loss seen (no decay visible above E),
  an exponent at 0 or 10;
- a constant the data do not pin down (least-squares fits, which carry intervals): an
  exponent whose 95% interval reaches 0, or an E whose interval reaches the lowest loss
  (the demo's frontier laws once reported alpha 0.58 [0, 2.6] as if it meant something);
- the points show no decline: the law falls by less than twice the residual scatter over
  the compute range, so the data cannot tell a power law from a constant;
- points off the law: a standardised residual r_i / s beyond 4 (s the robust scale,
  robust.py), or, for L(N, D), a point whose removal moves a constant outside its 95%
  interval (influence, by leave-one-out refits warm-started from the fit); each listed by
  its trial's label. Beyond EXACT_INFLUENCE points, n refits of n points (O(n^2)) give
  way to a screen: the one Newton step without each point (O(n p^2), by Sherman-Morrison,
  refine.leave_one_out_steps), and the exact refit only of the points whose step, taken
  SCREEN times, leaves an interval (docs/scaling.md, "At scale");
- an interval spanning more than an order of magnitude (high / low > 10) for any positive
  constant, for every law (least-squares t intervals or a bootstrap's percentile ones);
- the points steepen with compute: a parabola in log-log (log L against log C) through
  them bends down by more than two standard errors. Every E + A C^-alpha with E >= 0 bends
  up (its local exponent shrinks towards E), so such points are not yet in the power-law
  regime (early, unconverged or undertrained runs) and the law's extrapolation is biased.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .objective import alpha_on_bound, on_lower_bound_E
from .refine import BATCH_ROWS, leave_one_out_steps, predict_and_jacobian, refine
from .robust import OUTLIER_Z, SCALE_FLOOR, _robust_scale, raw_theta

_AT_LOWEST = 0.999  # E at or above this share of the lowest loss: on its upper bound
EXACT_INFLUENCE = 500  # up to this many points, every leave-one-out refit is made
SCREEN = 4.0  # beyond, only the points whose one-step move x SCREEN leaves an interval


@dataclass(frozen=True)
class FitCheck:
    """What a reader must know before trusting a fit (module doc)."""

    law: str  # the form that was fitted, e.g. "E + A·C^-alpha"
    fallback: str  # why a simpler law was fitted ('' if it was not)
    on_bound: tuple[str, ...]  # e.g. ("alpha = 0",)
    residuals: tuple[float, ...]  # L_fit / L - 1 per point
    regime: str  # '' when the points look like a power law, else why they do not
    unidentified: tuple[str, ...] = ()  # e.g. ("alpha's 95% CI reaches 0",)
    outliers: tuple[Outlier, ...] = ()
    wide: tuple[str, ...] = ()  # e.g. ("B's 95% CI spans 120x",)

    @property
    def rms(self) -> float:
        r = np.asarray(self.residuals)
        return float(np.sqrt(np.mean(r**2))) if r.size else float("nan")

    @property
    def max_residual(self) -> float:
        r = np.abs(np.asarray(self.residuals))
        return float(r.max()) if r.size else float("nan")

    @property
    def failed(self) -> bool:
        """A problem beyond the fallback (which is a fix, said in `fallback`)."""
        return bool(self.problems())

    def outlier_mask(self, n: int) -> np.ndarray:
        """The flagged points among the n fitted, as a mask."""
        mask = np.zeros(n, bool)
        mask[[o.index for o in self.outliers]] = True
        return mask

    @property
    def ok(self) -> bool:
        return not (self.fallback or self.failed)

    def problems(self) -> list[str]:
        """What is wrong beyond the fallback, in words."""
        parts = []
        if self.on_bound:
            parts.append(", ".join(self.on_bound) + " (on its bound)")
        if self.unidentified:
            parts.append(", ".join(self.unidentified) + " (not pinned down by the data)")
        if self.wide:
            parts.append(", ".join(self.wide) + " (more than an order of magnitude)")
        if self.outliers:
            parts.append(
                f"{len(self.outliers)} point(s) off the law: "
                + ", ".join(o.describe() for o in self.outliers)
            )
        if self.regime:
            parts.append(self.regime)
        return parts

    def summary(self) -> str:
        """'ok' or the problems, e.g. 'fell back to A·C^-alpha (no E); alpha's 95% CI
        reaches 0 (not pinned down by the data)'."""
        fell = [f"fell back to {self.law}"] if self.fallback else []
        return "; ".join(fell + self.problems()) or "ok"

    def to_dict(self) -> dict[str, Any]:
        return {
            "law": self.law,
            "ok": self.ok,
            "fallback": self.fallback,
            "on_bound": list(self.on_bound),
            "regime": self.regime,
            "unidentified": list(self.unidentified),
            "wide": list(self.wide),
            "outliers": [o.to_dict() for o in self.outliers],
            "residuals": [float(r) for r in self.residuals],
            "rms": self.rms,
            "max_residual": self.max_residual,
        }


@dataclass(frozen=True)
class Outlier:
    """A point the law does not describe: its label (trial id or run name), its residual
    L_fit / L - 1, standardised residual z and, if its removal moves a constant outside
    its interval, which (e.g. "beta 0.45 -> 0.38")."""

    label: str
    residual: float
    z: float
    moves: str = ""
    index: int = -1  # its row among the fitted points

    def describe(self) -> str:
        text = f"{self.label} ({self.residual:+.1%}, z = {self.z:+.1f}"
        return text + (f"; without it {self.moves}" if self.moves else "") + ")"

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "residual": self.residual, "z": self.z, "moves": self.moves}


def check_power_law(fit: Any, flops: np.ndarray, loss: np.ndarray, labels: Any = None) -> FitCheck:
    """Checks of an L(C) fit (PowerLawFit or an LsqFit of L(C)) on its points."""
    c = np.asarray(flops, dtype=float)
    y = np.asarray(loss, dtype=float)
    values = fit.values()
    predicted = np.asarray(fit.predict(c), dtype=float)
    residuals = predicted / y - 1.0
    bounds = _bounds(values, y, fit.has_E, exponents=("alpha",))
    regime = ""
    ends = np.ravel(fit.predict(np.array([c.min(), c.max()])))
    drop = float(np.log(ends[0] / ends[1]))
    scatter = float(np.sqrt(np.mean(np.log1p(residuals) ** 2)))
    if drop <= max(2 * scatter, 1e-6):
        regime = (
            f"no decline: the law falls {drop:.1%} over the compute range, within twice the "
            f"scatter ({scatter:.1%})"
        )
    elif _steepens(np.log(c), np.log(y)):
        regime = (
            "the points steepen with compute (concave in log-log): not yet in the power-law "
            "regime, extrapolation biased"
        )
    unidentified = _unidentified(fit, y, exponents=("alpha",))
    intervals = fit.intervals(0.95) if hasattr(fit, "intervals") else {}
    z = _standardised(np.log1p(residuals), fit.theta.size if hasattr(fit, "theta") else 3)
    outliers = tuple(
        Outlier(_label(labels, i), float(residuals[i]), float(z[i]), index=int(i))
        for i in np.flatnonzero(np.abs(z) > OUTLIER_Z)
    )
    return FitCheck(fit.form, fit.fallback, bounds, tuple(residuals), regime, unidentified,
                    outliers, _wide(intervals))  # fmt: skip


def check_chinchilla(
    fit: Any, n_params: np.ndarray, tokens: np.ndarray, loss: np.ndarray, *,
    intervals: Mapping[str, Any] | None = None, labels: Any = None,
) -> FitCheck:  # fmt: skip
    """Checks of an L(N, D) fit (ChinchillaFit, its robust.RobustLaw or an LsqFit):
    bounds, fallback, residuals, outliers and influence against `intervals` (a
    bootstrap's; by default the fit's own delta-method ones, if it has them)."""
    from .chinchilla import ChinchillaFit

    n = np.asarray(n_params, dtype=float)
    d = np.asarray(tokens, dtype=float)
    y = np.asarray(loss, dtype=float)
    predicted = np.asarray(fit.predict(n, d), dtype=float)
    residuals = predicted / y - 1.0
    if intervals is None:
        intervals = fit.intervals(0.95) if hasattr(fit, "intervals") else {}
    bounds = _bounds(fit.values(), y, fit.has_E, exponents=("alpha", "beta"))
    unidentified = _unidentified(fit, y, exponents=("alpha", "beta"), intervals=intervals)
    point = fit if isinstance(fit, ChinchillaFit) else getattr(fit, "fit", None)
    z = _standardised(np.log1p(residuals), 5 if fit.has_E else 4)
    moves = _influence(point, n, d, y, intervals) if point is not None and intervals else {}
    flagged = sorted(set(np.flatnonzero(np.abs(z) > OUTLIER_Z)) | set(moves))
    outliers = tuple(
        Outlier(_label(labels, i), float(residuals[i]), float(z[i]), moves.get(i, ""), int(i))
        for i in flagged
    )
    return FitCheck(fit.form, fit.fallback, bounds, tuple(residuals), "", unidentified,
                    outliers, _wide(intervals))  # fmt: skip


_MOVABLE = ("E", "A", "B", "alpha", "beta")


def _influence(
    point: Any, n: np.ndarray, d: np.ndarray, y: np.ndarray, intervals: Mapping[str, Any]
) -> dict[int, str]:
    """Points whose removal moves a constant outside its interval: the leave-one-out refits,
    warm-started from the fit (refine.py), of every point up to EXACT_INFLUENCE points, and
    beyond that of the points the one-step screen picks (module doc)."""
    if y.size <= 7:
        return {}
    rows = np.arange(y.size) if y.size <= EXACT_INFLUENCE else _screen(point, n, d, y, intervals)
    values = _without_each(point, n, d, y, rows)
    base = point.values()
    out = {}
    for j, i in enumerate(rows):
        moved = [f"{k} {base[k]:.3g} -> {v[j]:.3g}" for k, v in values.items()
                 if k in intervals and v[j] not in intervals[k]]  # fmt: skip
        if moved:
            out[int(i)] = ", ".join(moved)
    return out


def _constants(theta: np.ndarray, shift: np.ndarray, has_E: bool) -> dict[str, np.ndarray]:
    """E, A, B, alpha, beta of centred theta (B, p) with its centring shift (B, 2)."""
    o = 1 if has_E else 0
    theta = theta.copy()
    theta[:, o : o + 2] += theta[:, o + 2 :] * shift  # uncentre
    values = {"A": np.exp(theta[:, o]), "B": np.exp(theta[:, o + 1]),
              "alpha": theta[:, o + 2], "beta": theta[:, o + 3]}  # fmt: skip
    if has_E:
        values["E"] = np.exp(theta[:, 0])
    return values


def _without_each(
    point: Any, n: np.ndarray, d: np.ndarray, y: np.ndarray, rows: np.ndarray
) -> dict[str, np.ndarray]:
    """The constants refitted without each of `rows` in turn, a batch of refits at a time
    (memory O(batch x n), not O(n^2)); the same arithmetic as robust.stack_fit's."""
    o = 1 if point.has_E else 0
    log_x = np.stack([np.log(n), np.log(d)], axis=-1)
    per = max(1, BATCH_ROWS // y.size)
    parts: list[dict[str, np.ndarray]] = []
    for lo in range(0, rows.size, per):
        left = rows[lo : lo + per]
        mask = np.ones((left.size, y.size), bool)
        mask[np.arange(left.size), left] = False
        lx = np.broadcast_to(log_x, mask.shape + (2,))
        shift = (lx * mask[..., None]).sum(axis=1) / mask.sum(axis=1)[:, None]
        theta = np.tile(raw_theta(point), (left.size, 1))
        theta[:, o : o + 2] -= theta[:, o + 2 :] * shift  # centre (objective.centre)
        y_rep = np.broadcast_to(np.log(y), mask.shape)
        theta = refine(lx - shift[:, None, :], y_rep, mask, theta, has_E=point.has_E)
        parts.append(_constants(theta, shift, point.has_E))
    names = parts[0].keys() if parts else ()
    return {k: np.concatenate([part[k] for part in parts]) for k in names}


def _screen(
    point: Any, n: np.ndarray, d: np.ndarray, y: np.ndarray, intervals: Mapping[str, Any]
) -> np.ndarray:
    """The points worth an exact leave-one-out refit: those whose one-step move
    (refine.leave_one_out_steps), SCREEN times over, takes a constant outside its
    interval."""
    log_x = np.stack([np.log(n), np.log(d)], axis=-1)
    shift = log_x.mean(axis=0)
    theta = raw_theta(point)
    o = 1 if point.has_E else 0
    theta[o : o + 2] -= theta[o + 2 :] * shift
    pred, jac = predict_and_jacobian((log_x - shift)[None], theta[None], point.has_E)
    steps = leave_one_out_steps(pred[0] - np.log(y), jac[0])
    with np.errstate(over="ignore"):  # a step the others cannot absorb: picked below
        far = _constants(theta + SCREEN * np.nan_to_num(steps, posinf=1e6, neginf=-1e6),
                         np.broadcast_to(shift, (y.size, 2)), point.has_E)  # fmt: skip
    picked = ~np.isfinite(steps).all(axis=1)
    for k, v in far.items():
        if k in intervals:
            iv = intervals[k]
            picked |= ~((iv.low <= v) & (v <= iv.high))
    return np.flatnonzero(picked)


def _standardised(log_residuals: np.ndarray, p: int) -> np.ndarray:
    """r / s with s the robust scale of robust.py (outliers left out of it)."""
    r = np.asarray(log_residuals, dtype=float)
    if r.size <= p:
        return np.zeros_like(r)
    s0 = _robust_scale(r[None], p)[0]
    s = _robust_scale(np.where(np.abs(r) > OUTLIER_Z * s0, np.nan, r)[None], p)[0]
    return r / max(s, SCALE_FLOOR)


def _label(labels: Any, i: int) -> str:
    return f"point {i}" if labels is None else str(list(labels)[i])


def _wide(intervals: Mapping[str, Any]) -> tuple[str, ...]:
    out = []
    for name, iv in intervals.items():
        if name in _MOVABLE and iv.low > 0 and iv.high / iv.low > 10:
            out.append(f"{name}'s {iv.level:.0%} CI spans {iv.high / iv.low:.3g}x")
        elif name in _MOVABLE and iv.low <= 0 < iv.high and name in ("E", "A", "B"):
            out.append(f"{name}'s {iv.level:.0%} CI reaches 0")
    return tuple(out)


def _bounds(
    values: dict[str, float], loss: np.ndarray, has_E: bool, exponents: tuple[str, ...]
) -> tuple[str, ...]:
    out = []
    if has_E and on_lower_bound_E(values["E"], loss):
        out.append("E = 0")
    if has_E and values["E"] >= _AT_LOWEST * loss.min():
        out.append("E = lowest loss")
    for name in exponents:
        if alpha_on_bound(values[name]):
            out.append(f"{name} = {values[name]:.3g}")
    return tuple(out)


def _unidentified(
    fit: Any,
    loss: np.ndarray,
    exponents: tuple[str, ...],
    intervals: Mapping[str, Any] | None = None,
) -> tuple[str, ...]:
    """The constants whose 95% interval says the data do not pin them down (`intervals`,
    or the fit's own: lsq.LsqFit and robust.RobustLaw have them)."""
    if not intervals:
        if not hasattr(fit, "intervals"):
            return ()
        intervals = fit.intervals(0.95)  # the fits keep a degree of freedom: finite bounds
    out = [f"{name}'s 95% CI reaches 0" for name in exponents if intervals[name].low <= 1e-6]
    if fit.has_E and intervals["E"].high >= loss.min():
        out.append("E's 95% CI reaches the lowest loss")
    return tuple(out)


def _steepens(log_c: np.ndarray, log_y: np.ndarray) -> bool:
    """A parabola in log-log through the points bends down by over two standard errors."""
    if np.unique(log_c).size < 4:
        return False
    x = log_c - log_c.mean()
    design = np.column_stack([np.ones_like(x), x, x**2])
    coef, *_ = np.linalg.lstsq(design, log_y, rcond=None)
    resid = log_y - design @ coef
    dof = x.size - 3
    if dof < 1:
        return False
    cov = (resid @ resid / dof) * np.linalg.pinv(design.T @ design)
    return bool(coef[2] < -2.0 * np.sqrt(max(cov[2, 2], 1e-300)))
