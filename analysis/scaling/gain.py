"""Compute-equivalent gain of a variant against a baseline.

By default (law="shift", analysis/scaling/shift.py) the variant's loss curve is the
baseline's shifted in compute, L_v(C) = L_b(C / m), with L_b(C) = E + A C^-alpha: four
constants fitted on both variants' trials together, and m is the gain at every loss.

With law="separate", each variant's loss-versus-compute is fitted as L(C) = E + A C^-alpha
with its own A and alpha (and by default one E shared by both: the irreducible loss belongs
to the data, not the architecture); it needs more trials per variant. The gain at a
reference loss L* is then

    m = C_variant(L*) / C_baseline(L*),    C(L) = (A / (L - E))^(1/alpha),

"the variant reaches the baseline's loss L* with m times the baseline's FLOPs" (m < 1: the
variant is cheaper). By default L* = L_baseline(C_ref), the loss the baseline's law gives at
C_ref, the largest compute that both variants ran; then m = C_variant(L*) / C_ref.
m = inf when the variant's law never reaches L* (L* <= E_variant).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .bootstrap import EXACT_ROWS, Bootstrap, Interval, bootstrap, linearised_bootstrap
from .data import ScalingError, clean, column, has_column
from .objective import HUBER_DELTA, LogLaw, centre, minimise, uncentre
from .powerlaw import PowerLawFit, fit_power_law, pareto_frontier
from .refine import Linearised
from .shift import centred_theta, fit_shift, shift_jacobian, theta_bounds


@dataclass(frozen=True, eq=False)
class Trials:
    """One variant's trials: training FLOPs and final (or best) loss per trial."""

    name: str
    flops: np.ndarray
    loss: np.ndarray

    @classmethod
    def from_table(
        cls,
        table: Any,
        variant: str,
        *,
        loss: str = "final_loss",
        flops: str = "flops",
        variant_column: str = "variant",
    ) -> Trials:
        """Rows of `table` (pyarrow Table, DataFrame or dict of arrays) for `variant`."""
        labels = column(table, variant_column).astype(str)
        rows = labels == variant
        if not rows.any():
            raise ScalingError(
                f"no trials for variant {variant!r} (variants present: {sorted(set(labels))})"
            )
        return cls(
            variant,
            column(table, flops).astype(float)[rows],
            column(table, loss).astype(float)[rows],
        )


@dataclass(frozen=True)
class PairFit:
    """Baseline and variant laws fitted together, and the gain they imply."""

    baseline: PowerLawFit
    variant: PowerLawFit
    reference_loss: float
    multiplier: float

    def values(self) -> dict[str, float]:
        out = {"multiplier": self.multiplier, "reference_loss": self.reference_loss}
        out.update({f"baseline_{k}": v for k, v in self.baseline.values().items()})
        out.update({f"variant_{k}": v for k, v in self.variant.values().items()})
        return out


@dataclass(frozen=True)
class Gain:
    variant: str
    baseline: str
    multiplier: Interval  # m with its bootstrap interval
    reference_loss: float  # L*
    reference_flops: float  # C_baseline(L*)
    shared_E: bool
    law: str
    fit: PairFit  # point estimates
    n_resamples: int
    n_failed: int

    def __str__(self) -> str:
        m = self.multiplier
        if not np.isfinite(m.estimate):
            return (
                f"{self.variant} does not reach the {self.baseline} loss "
                f"{self.reference_loss:.4g} on its fitted law"
            )
        return (
            f"{self.variant} reaches the {self.baseline} loss at {m.estimate:.2f}× the FLOPs, "
            f"{m.level:.0%} CI [{m.low:.2f}, {m.high:.2f}]"
        )

    def describe(self) -> str:
        e = (
            "compute-shifted law"
            if self.law == "shift"
            else ("shared E" if self.shared_E else "separate E")
        )
        return (
            f"{self}  (L* = {self.reference_loss:.4g} at baseline C = "
            f"{self.reference_flops:.3g} FLOPs; {e}; "
            f"{self.n_resamples - self.n_failed}/{self.n_resamples} resamples)"
        )


def _fit_shared_e(
    c: np.ndarray, y: np.ndarray, group: np.ndarray, starts: Sequence[PowerLawFit]
) -> tuple[PowerLawFit, PowerLawFit]:
    """Joint fit: theta = [e, a_b, a_v, alpha_b, alpha_v], term j only on group j's rows."""
    log_c = np.log(c)
    shift = np.full(2, log_c.mean())
    mask = np.column_stack([group == 0, group == 1])
    law = LogLaw(X=np.column_stack([log_c, log_c]) - shift, y=np.log(y), mask=mask)
    fb, fv = starts
    rows = []
    for E in {fb.E, fv.E, float(np.sqrt(fb.E * fv.E))}:
        if E >= y.min():
            continue
        # profile each group's a for this E with its own alpha
        a = [
            np.mean(np.log(y[group == g] - E) + f.alpha * log_c[group == g])
            for g, f in ((0, fb), (1, fv))
        ]
        rows.append([np.log(E), a[0], a[1], fb.alpha, fv.alpha])
    theta, _ = minimise(law, centre(np.array(rows), shift))
    e, a_b, a_v, alpha_b, alpha_v = uncentre(theta, shift)
    n_b, n_v = int((group == 0).sum()), int((group == 1).sum())
    return (
        PowerLawFit(float(np.exp(e)), float(np.exp(a_b)), float(alpha_b), n_b),
        PowerLawFit(float(np.exp(e)), float(np.exp(a_v)), float(alpha_v), n_v),
    )


def _fit_pair(
    flops: np.ndarray,
    loss: np.ndarray,
    group: np.ndarray,
    *,
    shared_E: bool,
    frontier: bool,
    at_loss: float | None,
    c_ref: float,
    law: str = "shift",
    start: PairFit | None = None,
) -> PairFit:
    if frontier:
        rows = np.concatenate(
            [
                np.flatnonzero(group == g)[pareto_frontier(flops[group == g], loss[group == g])]
                for g in (0, 1)
            ]
        )
        flops, loss, group = flops[rows], loss[rows], group[rows]
    b = group == 0
    if law == "shift":
        warm = None
        if start is not None:
            p = start.baseline
            warm = (p.E, p.A, p.alpha, start.multiplier)
        fb, fv, m = fit_shift(flops, loss, ~b, start=warm)
        ref = float(fb.predict(c_ref)) if at_loss is None else at_loss
        return PairFit(fb, fv, ref, m)
    if shared_E and start is not None:  # bootstrap resample: warm start the joint fit only
        fb, fv = _fit_shared_e(flops, loss, group, (start.baseline, start.variant))
    else:
        fb = fit_power_law(flops[b], loss[b], start=None if start is None else start.baseline)
        fv = fit_power_law(flops[~b], loss[~b], start=None if start is None else start.variant)
        if shared_E:
            fb, fv = _fit_shared_e(flops, loss, group, (fb, fv))
    ref = float(fb.predict(c_ref)) if at_loss is None else at_loss
    if ref <= fb.E:
        raise ScalingError(
            f"reference loss {ref:.4g} is at or below the baseline's fitted E = {fb.E:.4g}: "
            "the baseline never reaches it"
        )
    m = float(fv.flops_at(ref) / fb.flops_at(ref))
    return PairFit(fb, fv, ref, m)


def compute_equivalent_gain(
    variant: Trials,
    baseline: Trials,
    *,
    at_loss: float | None = None,
    law: str = "shift",
    shared_E: bool = True,
    frontier: bool = False,
    n_resamples: int = 1000,
    level: float = 0.95,
    seed: int = 0,
) -> Gain:
    """The FLOPs multiplier m at which `variant` reaches `baseline`'s loss (module doc),
    with a bootstrap interval that resamples each variant's trials separately.

    `frontier=True` fits each variant's Pareto frontier (recomputed per resample) instead
    of all its trials, for sweeps with off-optimal runs."""
    what = f"gain of {variant.name!r} over {baseline.name!r}"
    yb, cb = clean(baseline.loss, {"flops": baseline.flops}, what=f"{what}, baseline")
    yv, cv = clean(variant.loss, {"flops": variant.flops}, what=f"{what}, variant")
    cb, cv = cb["flops"], cv["flops"]
    c_ref = float(min(cb.max(), cv.max()))
    if at_loss is None and c_ref < max(cb.min(), cv.min()):
        raise ScalingError(
            f"{what}: the compute ranges do not overlap (baseline {cb.min():.3g}–"
            f"{cb.max():.3g}, variant {cv.min():.3g}–{cv.max():.3g}); pass at_loss="
        )
    flops = np.concatenate([cb, cv])
    loss = np.concatenate([yb, yv])
    group = np.concatenate([np.zeros(cb.size, int), np.ones(cv.size, int)])
    if law not in ("shift", "separate"):
        raise ScalingError(f"{what}: law must be 'shift' or 'separate', got {law!r}")
    fit = functools.partial(
        _fit_pair, shared_E=shared_E, frontier=frontier, at_loss=at_loss, c_ref=c_ref, law=law
    )
    options = {"n_resamples": n_resamples, "level": level, "seed": seed}
    if law == "shift" and not frontier and loss.size > EXACT_ROWS:
        boot = _linearised_shift(fit(flops, loss, group), flops, loss, group, c_ref, at_loss,
                                 **options)  # fmt: skip
    else:
        boot = bootstrap(fit, flops, loss, group, strata=group, **options)
    point: PairFit = boot.point
    return Gain(
        variant=variant.name,
        baseline=baseline.name,
        multiplier=boot["multiplier"],
        reference_loss=point.reference_loss,
        reference_flops=float(point.baseline.flops_at(point.reference_loss)),
        shared_E=shared_E,
        law=law,
        fit=point,
        n_resamples=n_resamples,
        n_failed=boot.n_failed,
    )


def _linearised_shift(
    point: PairFit, flops: np.ndarray, loss: np.ndarray, group: np.ndarray, c_ref: float,
    at_loss: float | None, **options: Any,
) -> Bootstrap[PairFit]:  # fmt: skip
    """The compute-shifted law's bootstrap beyond bootstrap.EXACT_ROWS trials: the same
    resamples within each variant, each refit as the law linearised at `point`
    (bootstrap.linearised_bootstrap; docs/scaling.md, "At scale")."""
    x = np.log(flops)
    shift = float(x.mean())  # fit_shift's centring
    theta = centred_theta(point.baseline, point.multiplier, shift)
    pred, jac = shift_jacobian(theta, x - shift, (group == 1).astype(float))
    free = np.isfinite(theta)  # e = -inf: the law without E keeps no E
    low, high = theta_bounds(loss)
    law = Linearised(pred - np.log(loss), jac[:, free], HUBER_DELTA, (low - theta)[free],
                     (high - theta)[free])  # fmt: skip
    n_b, n_v = int((group == 0).sum()), int((group == 1).sum())
    has_E, fallback = bool(free[0]), point.baseline.fallback

    def values(step: np.ndarray) -> dict[str, float]:
        t = theta.copy()
        t[free] += step
        e, a, alpha, log_m = t
        E = float(np.exp(e)) if has_E else 0.0
        A, m = float(np.exp(a + alpha * shift)), float(np.exp(log_m))
        fb = PowerLawFit(E, A, float(alpha), n_b, has_E=has_E, fallback=fallback)
        fv = PowerLawFit(E, A * m**alpha, float(alpha), n_v, has_E=has_E, fallback=fallback)
        ref = float(fb.predict(c_ref)) if at_loss is None else at_loss
        return PairFit(fb, fv, ref, m).values()

    return linearised_bootstrap(point, law, values, strata=group, **options)


def gains(
    table: Any,
    *,
    baseline: str = "dense",
    loss: str = "final_loss",
    flops: str = "flops",
    variant_column: str = "variant",
    **options: Any,
) -> list[Gain]:
    """`compute_equivalent_gain` of every other variant in `table` against `baseline`."""
    if not has_column(table, variant_column):
        raise ScalingError(f"the results table has no column {variant_column!r}")
    names = sorted(set(column(table, variant_column).astype(str)))
    if baseline not in names:
        raise ScalingError(
            f"no baseline: variant {baseline!r} has no trials (variants present: {names})"
        )
    if len(names) == 1:
        raise ScalingError(f"only the baseline {baseline!r} was run: nothing to compare")
    kw = {"loss": loss, "flops": flops, "variant_column": variant_column}
    base = Trials.from_table(table, baseline, **kw)
    return [
        compute_equivalent_gain(Trials.from_table(table, v, **kw), base, **options)
        for v in names
        if v != baseline
    ]
