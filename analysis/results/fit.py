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

The laws are those registered in laws/ (L(C), L(N, D), IsoFLOP, in that order, and any
`laws.register` adds), each variant's fits in `SweepFit.law_fits[law][variant]`; `laws`,
`chinchilla`, `isoflop` and their checks read the built-in ones from there.
"""

from __future__ import annotations

import warnings
from dataclasses import InitVar, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from . import laws as law_registry
from .laws import FitOptions, LawFit, VariantTrials
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
# the built-in laws (laws/) by name, as the properties of SweepFit read them
POWER_LAW, CHINCHILLA, ISOFLOP = "power_law", "chinchilla", "isoflop"


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
    # every registered law's fits (laws/): law name -> variant -> its fit
    law_fits: dict[str, dict[str, LawFit]] = field(default_factory=dict)
    frontier: dict[str, list[str]] = field(default_factory=dict)  # trial ids by compute
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
    per_variant: tuple[str, ...] = ()  # keys that are each variant's own, not cell axes
    # L(C)'s checks of a SweepFit built by hand (read back as the `law_checks` property)
    law_checks: InitVar[dict[str, FitCheck] | None] = None

    def __post_init__(self, law_checks: dict[str, FitCheck] | None) -> None:
        for v, check in (law_checks or {}).items():
            self.law_fits.setdefault(POWER_LAW, {})[v] = LawFit(None, check=check)

    def to_dict(self) -> dict[str, Any]:
        from .export import sweep_fit_dict

        return sweep_fit_dict(self)

    def paired_gain(self, variant: str) -> PairedGain | None:
        return next((p for p in self.paired if p.variant == variant), None)

    def results(self, law: str) -> dict[str, Any]:
        """The law's own fits (an LsqFit, a Bootstrap, ...) by variant."""
        fits = self.law_fits.get(law, {})
        return {v: r.result for v, r in fits.items() if r.result is not None}

    def checks_of(self, law: str) -> dict[str, FitCheck]:
        """The law's checks by variant."""
        fits = self.law_fits.get(law, {})
        return {v: r.check for v, r in fits.items() if r.check is not None}

    def checks(self) -> list[tuple[str, str, FitCheck]]:
        """(the law's short label, variant, check) of every checked fit, laws in order."""
        out = []
        for name, fits in self.law_fits.items():
            law = law_registry.law_named(name)
            label = (law.short or law.label or name) if law is not None else name
            out += [(label, v, r.check) for v, r in fits.items() if r.check is not None]
        return out

    # the built-in laws' fits by the names they had before the registry
    @property
    def laws(self) -> dict[str, LsqFit]:
        """L(C) per variant, on its frontier."""
        return self.results(POWER_LAW)

    @property
    def chinchilla(self) -> dict[str, Bootstrap]:
        """L(N, D) per variant (and "<variant> without outliers")."""
        return self.results(CHINCHILLA)

    @property
    def chinchilla_checks(self) -> dict[str, FitCheck]:
        return self.checks_of(CHINCHILLA)

    @property
    def isoflop(self) -> dict[str, IsoFlopFit]:
        return self.results(ISOFLOP)

    def predict(
        self, law: str, variant: str, *, n_params: Any = np.nan, tokens: Any = np.nan,
        flops: Any = np.nan, level: float | None = None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
        """The loss of new runs of `variant` at (N, D, C) by a registered law that
        forecasts (Law.predict): (estimate, low, high) at `level` (default the fit's)."""
        fitted = self.law_fits.get(law, {}).get(variant)
        found = law_registry.law_named(law)
        if fitted is None or fitted.result is None or found is None:
            raise ResultsError(f"no {law} fit of {variant!r} in sweep {self.sweep!r}")
        shape = np.broadcast(n_params, tokens, flops).shape or (1,)
        n, d, c = (np.broadcast_to(np.asarray(x, float), shape) for x in (n_params, tokens, flops))
        level = self.level if level is None else level
        out = found.predict(fitted, n_params=n, tokens=d, flops=c, level=level)
        if out is None:
            raise ResultsError(f"the {law} law does not forecast a run's loss")
        return out


# L(C)'s checks by variant; also the keyword of __init__ that sets them (an InitVar), so the
# property goes on after the dataclass is made
SweepFit.law_checks = property(  # type: ignore[assignment]
    lambda self: self.checks_of(POWER_LAW), doc="L(C)'s checks by variant."
)


def fit_sweep(
    sweep: str, *, root: Path | None = None, where: str | None = None, **options: Any
) -> SweepFit:
    """All the fits the sweep's data supports (module doc). Needs a prior `sync` (or
    `import`). `where` filters the trials first (`results query`'s --where). `options`
    are fit_table's: baseline, loss, n_resamples, level, seed, effect, power, resample
    (False skips the bootstrap, the slow part: the unpaired gains and Chinchilla's L(N, D);
    `results advise` needs neither), budgets, huber_delta, holdout_flops,
    isoflop_bin_width. A tuned sweep's trials are read at each variant's own tuned rate
    (results/tuned_gain.py: the search's trials and the others at the baseline's rate left
    out), as its summary reads them."""
    from .tuned_gain import split_by_rate

    table = trials_where(sweep, where, root)
    split = split_by_rate(table, options.get("baseline", "dense"))
    if split is None:
        fit = fit_table(table, sweep, **options)
        fit.where = where
        return fit
    fit = fit_table(split.own, sweep, per_variant=("train.lr",), **options)
    fit.where = "; ".join(w for w in (where, "each variant at its own tuned rate") if w)
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
    per_variant: tuple[str, ...] = (),
) -> SweepFit:
    """The fits (module doc). `per_variant`: keys that are each variant's own setting, not
    a cell axis (design.read_design; a tuned sweep's `train.lr`). `budgets`: the compute budgets of the allocation N*(C), D*(C)
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
    fit.per_variant = per_variant
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

    options = FitOptions(level, n_resamples, seed, resample, fit.huber_delta,
                         isoflop_bin_width, exclude_outliers, budgets)  # fmt: skip
    laws = law_registry.registered()
    fit.law_fits = {law.name: {} for law in laws}
    for v in variants:
        rows = used.filter(_eq(used, "variant", v))
        for law in laws:
            law_registry.fit_law(law, VariantTrials(v, rows, loss, options, fit, attempt))
    for law in laws:
        law.after(fit, options, attempt)
    if not any(law.results(fit) for law in laws):
        sizes = sorted(set(used["size"].to_pylist()))
        why = (
            f"one size ({sizes[0]}): no fit possible"
            if len(sizes) == 1
            else (fit.notes[-1] if fit.notes else "too few trials")
        )
        raise ResultsError(f"no scaling law could be fitted for sweep {sweep!r}: {why}")
    boot_opts = options.bootstrap
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
    design = read_design(used, fit.per_variant)
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
