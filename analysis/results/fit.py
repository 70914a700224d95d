"""Scaling fits of one synced sweep (analysis.scaling on the `trials` table).

Uses FINISHED trials with a finite final loss; everything left out is said in `notes`.
Per variant: L(C) = E + A C^-alpha through its compute frontier (least squares, t
intervals, checks: constants on a bound, the fallback to the law without E, residuals,
the power-law regime); Chinchilla's L(N, D) when the variant has >= 3 distinct N and D;
IsoFLOP parabolas when the sweep has an isoflop axis (>= 2 nominal budgets,
`budget_flops`). Against the baseline: each variant's compute-equivalent gain by two
estimators (paired over trials with the same cell and seed, and unpaired from a law
through both variants' trials), the per-cell differences, and what to run next. The
baseline's largest size is held out and forecast from the smaller ones (the backtest).
A part that the data cannot support is skipped with the reason; if no law at all can be
fitted, `fit_sweep` raises ResultsError (e.g. a sweep with one size).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .query import trials_where
from .tables import ResultsError
from .usable import usable_trials

if TYPE_CHECKING:
    import pyarrow as pa

    from scalelab.analysis.scaling import Bootstrap, CellComparison, Gain, IsoFlopFit, PairedGain
    from scalelab.analysis.scaling.checks import FitCheck
    from scalelab.analysis.scaling.lsq import LsqFit
    from scalelab.analysis.scaling.power_analysis import Advice

    from .allocation import Allocation
    from .loss_forecast import Forecast

LOSS = "final_val_loss"


@dataclass
class SweepFit:
    sweep: str
    baseline: str
    loss: str
    level: float
    n_trials: int
    n_used: int
    variants: list[str]
    table: pa.Table  # the trials used (FINISHED, finite loss)
    laws: dict[str, LsqFit] = field(default_factory=dict)  # L(C) per variant, on its frontier
    law_checks: dict[str, FitCheck] = field(default_factory=dict)
    frontier: dict[str, list[str]] = field(default_factory=dict)  # trial ids by compute
    chinchilla: dict[str, Bootstrap] = field(default_factory=dict)
    chinchilla_checks: dict[str, FitCheck] = field(default_factory=dict)
    isoflop: dict[str, IsoFlopFit] = field(default_factory=dict)
    gains: list[Gain] = field(default_factory=list)  # unpaired
    paired: list[PairedGain] = field(default_factory=list)
    slope_law: LsqFit | None = None  # the baseline's log-log slope the paired gains use
    axes: tuple[str, ...] = ()  # the swept axes that define a cell (design.py)
    cells: list[CellComparison] = field(default_factory=list)
    backtest: Forecast | None = None
    advice: list[Advice] = field(default_factory=list)
    allocation: list[Allocation] = field(default_factory=list)  # N*, D* at the budgets
    notes: list[str] = field(default_factory=list)
    huber_delta: float | None = None  # the robust L(N, D) fit's (fit_table sets it)
    where: str | None = None  # the filter the trials went through, if any

    def to_dict(self) -> dict[str, Any]:
        from .export import sweep_fit_dict

        return sweep_fit_dict(self)

    def paired_gain(self, variant: str) -> PairedGain | None:
        return next((p for p in self.paired if p.variant == variant), None)


def fit_sweep(
    sweep: str, *, root: Path | None = None, where: str | None = None, **options: Any
) -> SweepFit:
    """All the fits the sweep's data supports (module doc). Needs a prior `sync` (or
    `import`). `where` filters the trials first (`results query`'s --where). `options`
    are fit_table's: baseline, loss, n_resamples, level, seed, effect, power, resample
    (False skips the bootstrap, the slow part: the unpaired gains and Chinchilla's L(N, D);
    `results advise` needs neither), budgets, huber_delta, holdout_flops,
    isoflop_bin_width."""
    fit = fit_table(trials_where(sweep, where, root), sweep, **options)
    fit.where = where
    return fit


def fit_table(
    table: pa.Table,
    sweep: str,
    *,
    baseline: str = "dense",
    loss: str = LOSS,
    n_resamples: int = 1000,
    level: float = 0.95,
    seed: int = 0,
    effect: float = 0.05,
    power: float = 0.8,
    resample: bool = True,
    exclude_outliers: bool = False,
    budgets: tuple[float, ...] | None = None,
    huber_delta: float | None = None,
    holdout_flops: float | None = None,
    isoflop_bin_width: float | None = None,
) -> SweepFit:
    """The fits (module doc). `budgets`: the compute budgets of the allocation N*(C), D*(C)
    (default: the largest FLOPs of the trials, 10x and 100x it); `huber_delta`: the robust
    L(N, D) fit's (default objective.HUBER_DELTA); `holdout_flops`: the backtest holds out the trials above this compute
    instead of the largest size; `isoflop_bin_width`: IsoFLOP profiles from the trials'
    real FLOPs binned in bins this many decades wide, instead of nominal budgets."""
    from scalelab.analysis.scaling import HUBER_DELTA, ScalingError, ScalingWarning

    if loss not in table.column_names:
        raise ResultsError(f"unknown loss column {loss!r} (use final_val_loss or best_val_loss)")
    notes: list[str] = []
    used = usable_trials(table, loss, notes)
    variants = sorted(set(used["variant"].to_pylist()))
    if baseline not in variants and len(variants) > 1:
        raise ResultsError(
            f"no baseline: variant {baseline!r} has no finished trials in sweep {sweep!r} "
            f"(variants: {', '.join(variants)}); choose one with --baseline"
        )
    fit = SweepFit(sweep, baseline, loss, level, table.num_rows, used.num_rows, variants, used)
    fit.notes.extend(notes)
    fit.huber_delta = HUBER_DELTA if huber_delta is None else huber_delta

    def attempt(what: str, fn: Any) -> Any:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                return fn()
            except (ScalingError, ResultsError) as e:
                fit.notes.append(f"{what}: {e}")
                return None
            finally:
                # ScalingWarnings say what was dropped; numpy's RuntimeWarnings inside
                # the optimiser's line search are not news for the reader
                fit.notes.extend(
                    f"{what}: {w.message}" for w in caught if issubclass(w.category, ScalingWarning)
                )

    boot_opts = {"n_resamples": n_resamples, "level": level, "seed": seed} if resample else None
    for v in variants:
        _fit_variant(fit, used.filter(_eq(used, "variant", v)), v, attempt, boot_opts,
                     exclude_outliers, isoflop_bin_width)  # fmt: skip
    if fit.chinchilla:
        from .allocation import allocate, default_budgets

        chosen = tuple(budgets) if budgets else default_budgets(used)
        for v, law in fit.chinchilla.items():
            found = attempt(f"allocation of {v}", lambda v=v, law=law: allocate(v, law, chosen))
            fit.allocation += found or []
    elif budgets:
        fit.notes.append(
            "allocation at --budget: needs Chinchilla's L(N, D) (3 or more sizes and token "
            "counts), which no variant has"
        )
    if not fit.laws and not fit.chinchilla and not fit.isoflop:
        sizes = sorted(set(used["size"].to_pylist()))
        why = (
            f"one size ({sizes[0]}): no fit possible"
            if len(sizes) == 1
            else (fit.notes[-1] if fit.notes else "too few trials")
        )
        raise ResultsError(f"no scaling law could be fitted for sweep {sweep!r}: {why}")
    if len(variants) > 1:
        _compare(fit, used, attempt, boot_opts, (effect, power))
    else:
        fit.notes.append(f"only one variant ({variants[0]}): no gains to compute")
    if fit.huber_delta != HUBER_DELTA:
        fit.notes.append(
            f"--huber-delta {fit.huber_delta:g} is the fit's L(N, D) only: the backtest and "
            f"`results forecast` fit theirs with the default {HUBER_DELTA:g}"
        )
    if holdout_flops is not None:
        from .loss_forecast import forecast_table

        fit.backtest = attempt(
            f"backtest above {holdout_flops:.3g} FLOPs",
            lambda: forecast_table(used, sweep, variant=baseline, holdout_flops=holdout_flops,
                                   loss=loss, level=level),
        )  # fmt: skip
    elif len(set(used.filter(_eq(used, "variant", baseline))["size"].to_pylist())) >= 3:
        from .loss_forecast import forecast_table

        largest = _largest_size(used.filter(_eq(used, "variant", baseline)))
        fit.backtest = attempt(
            f"backtest on {largest}",
            lambda: forecast_table(used, sweep, variant=baseline, holdout=largest, loss=loss,
                                   level=level),
        )  # fmt: skip
    return fit


def _fit_variant(
    fit: SweepFit, rows: pa.Table, v: str, attempt: Any, boot_opts: dict | None,
    exclude_outliers: bool = False,
    bin_width: float | None = None,
) -> None:  # fmt: skip
    """The per-variant laws: L(C) on the frontier, Chinchilla (unless boot_opts is None;
    with exclude_outliers, again without the points its check flags, as
    "<variant> without outliers"), IsoFLOP (on nominal budgets, or on the real FLOPs
    binned `bin_width` decades wide)."""
    from functools import partial

    from scalelab.analysis.scaling import pareto_frontier
    from scalelab.analysis.scaling.checks import check_chinchilla, check_power_law
    from scalelab.analysis.scaling.chinchilla import bootstrap_chinchilla
    from scalelab.analysis.scaling.lsq import lsq_power_law

    c, y = _col(rows, "flops"), _col(rows, fit.loss)
    ids = rows["trial_id"].to_pylist()
    front = attempt(f"frontier of {v}", lambda: pareto_frontier(c, y))
    if front is not None:
        fit.frontier[v] = [ids[i] for i in front]
        if front.size < 3 or np.unique(c[front]).size < 2:
            fit.notes.append(
                f"L(C) of {v}: its frontier has {front.size} trial(s), too few: fitted on all "
                f"{rows.num_rows} trials"
            )
            front = np.arange(rows.num_rows)
        law = attempt(f"L(C) of {v}", lambda: lsq_power_law(c[front], y[front]))
        if law is not None:
            fit.laws[v] = law
            labels = [ids[i] for i in front]
            fit.law_checks[v] = check_power_law(law, c[front], y[front], labels=labels)
    n, d = _col(rows, "n_params"), _col(rows, "tokens")
    rich = np.unique(n).size >= 3 and np.unique(d).size >= 3 and rows.num_rows >= 6
    robust = partial(bootstrap_chinchilla, delta=fit.huber_delta)
    if boot_opts is not None and rich:
        ch = attempt(
            f"Chinchilla L(N, D) of {v}",
            lambda: robust(n, d, y, **boot_opts),
        )
        if ch is not None:
            fit.chinchilla[v] = ch
            check = check_chinchilla(ch.point, n, d, y, intervals=ch.intervals, labels=ids)
            fit.chinchilla_checks[v] = check
            if exclude_outliers and check.outliers:
                keep = ~check.outlier_mask(y.size)
                name = f"{v} without outliers"
                clean = attempt(
                    f"Chinchilla L(N, D) of {name}",
                    lambda: robust(n[keep], d[keep], y[keep], **boot_opts),
                )
                if clean is not None:
                    fit.chinchilla[name] = clean
                    fit.chinchilla_checks[name] = check_chinchilla(
                        clean.point, n[keep], d[keep], y[keep], intervals=clean.intervals,
                        labels=[i for i, k in zip(ids, keep, strict=True) if k],
                    )  # fmt: skip
                    fit.notes.append(
                        f"{name}: refitted without {len(check.outliers)} flagged point(s): "
                        + ", ".join(o.label for o in check.outliers)
                    )
    _fit_isoflop(fit, rows, v, attempt, bin_width)


def _fit_isoflop(
    fit: SweepFit, rows: pa.Table, v: str, attempt: Any, bin_width: float | None
) -> None:
    """IsoFLOP parabolas on the nominal budgets (an isoflop axis), or with `bin_width` on
    the real FLOPs binned (bins with fewer than 3 sizes are left out, and said)."""
    from scalelab.analysis.scaling import fit_isoflop
    from scalelab.analysis.scaling.isoflop import bin_budgets

    n, d, y = _col(rows, "n_params"), _col(rows, "tokens"), _col(rows, fit.loss)
    if bin_width is not None:
        budgets = bin_budgets(_col(rows, "flops"), bin_width)
        keep = np.zeros(rows.num_rows, bool)
        for b in np.unique(budgets[np.isfinite(budgets)]):
            members = budgets == b
            keep |= members & (np.unique(n[members]).size >= 3)
        dropped = np.unique(budgets[~keep & np.isfinite(budgets)]).size
        if dropped:
            fit.notes.append(
                f"IsoFLOP of {v}: {dropped} FLOPs bin(s) {bin_width:g} decades wide with "
                "fewer than 3 sizes left out"
            )
        budgets, n, d, y = budgets[keep], n[keep], d[keep], y[keep]
    elif "budget_flops" in rows.column_names:
        budgets = _col(rows, "budget_flops")
    else:
        return
    if budgets.size and np.isfinite(budgets).all() and np.unique(budgets).size >= 2:
        iso = attempt(f"IsoFLOP of {v}", lambda: fit_isoflop(budgets, n, y, tokens=d))
        if iso is not None:
            fit.isoflop[v] = iso
    elif bin_width is not None:
        fit.notes.append(f"IsoFLOP of {v}: fewer than 2 FLOPs bins with 3 or more sizes")


def _compare(
    fit: SweepFit, used: pa.Table, attempt: Any, boot_opts: dict | None, target: tuple
) -> None:
    """Against the baseline: unpaired (unless boot_opts is None) and paired gains,
    per-cell differences, and the advice for a target (effect, power)."""
    from scalelab.analysis.scaling import (
        Trials,
        cell_means,
        compare_cells,
        compute_equivalent_gain,
        pair_trials,
        paired_gain,
    )
    from scalelab.analysis.scaling.lsq import lsq_power_law

    from .advice import advise_gain
    from .design import read_design

    baseline, loss = fit.baseline, fit.loss
    design = read_design(used)
    fit.axes = design.axes
    table = design.table
    base = Trials.from_table(used, baseline, loss=loss)
    slope = attempt(
        f"{baseline}'s log-log slope through its cells",
        lambda: lsq_power_law(*cell_means(table, baseline, loss=loss, axes=design.axes),
                              with_E=False),
    )  # fmt: skip
    fit.slope_law = slope
    for v in fit.variants:
        if v == baseline:
            continue
        if boot_opts is not None:
            g = attempt(
                f"unpaired gain of {v} vs {baseline}",
                lambda v=v: compute_equivalent_gain(
                    Trials.from_table(used, v, loss=loss), base, **boot_opts
                ),
            )
            if g is not None:
                fit.gains.append(g)
        if slope is None:
            continue
        p = attempt(
            f"paired gain of {v} vs {baseline}",
            lambda v=v: paired_gain(
                pair_trials(table, v, baseline, loss=loss, axes=design.axes), slope,
                level=fit.level,
            ),
        )  # fmt: skip
        if p is None:
            continue
        fit.paired.append(p)
        if p.pairs.n_averaged:
            fit.notes.append(
                f"paired gain of {v}: {p.pairs.n_averaged} trials sharing a cell and seed with "
                "another of the same variant (its own swept settings) were averaged"
            )
        advice = attempt(
            f"advice for {v}",
            lambda p=p: advise_gain(table, p, slope, effect=target[0], power=target[1]),
        )
        if advice is not None:
            fit.advice.append(advice)
    cells = attempt(
        "per-cell comparison",
        lambda: compare_cells(table, baseline=baseline, loss=loss, axes=design.axes,
                              arms=design.arms),
    )  # fmt: skip
    fit.cells = cells or []


def _largest_size(table: pa.Table) -> str:
    """The size label whose smallest N is largest (one pass, not a filter per size)."""
    sizes, which = np.unique(np.array(table["size"].to_pylist(), dtype=object).astype(str),
                             return_inverse=True)  # fmt: skip
    smallest = np.full(sizes.size, np.inf)
    np.minimum.at(smallest, which, _col(table, "n_params"))
    return str(sizes[int(np.argmax(smallest))])


def _eq(table: pa.Table, column: str, value: str) -> Any:
    import pyarrow.compute as pc

    return pc.equal(table[column], value)


def _col(table: pa.Table, name: str) -> np.ndarray:
    return table[name].to_numpy(zero_copy_only=False).astype(float)
