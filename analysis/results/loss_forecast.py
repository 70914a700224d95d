"""Forecasts for a synced sweep: the final loss of a larger run, with a prediction
interval, from the smaller ones (analysis.scaling.loss_interval), and the backtest that
holds out a size that was run and checks the forecast against it.

Targets: `size` (a preset larger than the sweep's, at each of the variant's token budgets,
its parameters and FLOPs counted from the trials' own config with that size), `flops` (a
compute budget: the law through the variant's compute frontier) or `holdout` (a size that
was run: the law through the smaller sizes only, each of its trials a target).

Why one module: a forecast and its backtest are the same computation on different targets,
so they share the target rules and the notes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from .tables import ResultsError

if TYPE_CHECKING:
    import pyarrow as pa

    from scalelab.analysis.scaling.loss_interval import ForecastLaw, Prediction


@dataclass(frozen=True)
class Target:
    label: str
    n_params: float
    tokens: float
    flops: float
    actual: float = float("nan")  # the loss a held-out run reached


@dataclass(frozen=True, eq=False)
class Forecast:
    sweep: str
    variant: str
    law: ForecastLaw
    fitted_on: str  # which trials the law went through, in words
    targets: list[Target]
    predictions: list[Prediction]
    holdout: str | None = None
    notes: list[str] = field(default_factory=list)
    without_outliers: Forecast | None = None  # the same, refitted without the flagged points
    seen_losses: tuple[float, float] = (float("nan"), float("inf"))  # the fitted runs' range

    def useful(self, p: Prediction) -> bool:
        """An interval no wider than the fitted runs' losses (module doc, `_reach_notes`)."""
        low, high = self.seen_losses
        return not p.high - p.low > high - low

    @property
    def covered(self) -> list[bool]:
        return [t.actual in p for t, p in zip(self.targets, self.predictions, strict=True)]

    def title(self) -> str:
        what = (
            f"backtest of {self.variant} on held-out {self.holdout}"
            if self.holdout
            else f"forecast of {self.variant}"
        )
        return f"{what}: {self.law.name} = {self.law.law.form} through {self.fitted_on}"

    def summary(self) -> str:
        """One line: what was predicted and, for a backtest, whether it held."""
        level = self.predictions[0].level
        parts = []
        for t, p in zip(self.targets, self.predictions, strict=True):
            text = f"{t.label}: {p.loss:.3f} [{p.low:.3f}, {p.high:.3f}]"
            if not self.useful(p):
                text = f"{t.label}: no useful forecast ({p.loss:.3f} [{p.low:.3f}, {p.high:.3f}]"
                text += " is wider than the fitted runs' losses)"
            if np.isfinite(t.actual):
                text += f", actual {t.actual:.3f} ({'inside' if t.actual in p else 'OUTSIDE'})"
            parts.append(text)
        return f"{self.title()} ({level:.0%} PI): " + "; ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        from .export import num

        return {
            "sweep": self.sweep,
            "variant": self.variant,
            "law": self.law.name,
            "form": self.law.law.form,
            "check": self.law.check.to_dict(),
            "constants": {k: num(v) for k, v in self.law.law.values().items()},
            "fitted_on": self.fitted_on,
            "holdout": self.holdout,
            "targets": [
                {
                    "label": t.label,
                    "n_params": num(t.n_params),
                    "tokens": num(t.tokens),
                    "flops": num(t.flops),
                    "predicted": num(p.loss),
                    "low": num(p.low),
                    "high": num(p.high),
                    "level": p.level,
                    "useful": self.useful(p),
                    "actual": num(t.actual) if np.isfinite(t.actual) else None,
                    "covered": (t.actual in p) if np.isfinite(t.actual) else None,
                    "spread": None
                    if p.spread is None
                    else {
                        "parameter": p.spread.parameter,
                        "scatter": p.spread.scatter,
                        "misfit": p.spread.misfit,
                        "extrapolation": p.spread.extrapolation,
                        "distance": p.spread.distance,
                    },
                }
                for t, p in zip(self.targets, self.predictions, strict=True)
            ],
            "notes": self.notes,
            "without_outliers": (
                self.without_outliers.to_dict() if self.without_outliers is not None else None
            ),
        }


def forecast_table(
    table: pa.Table,
    sweep: str,
    *,
    variant: str = "dense",
    size: str | None = None,
    flops: float | None = None,
    holdout: str | None = None,
    loss: str = "final_val_loss",
    law: str = "auto",
    level: float = 0.95,
    exclude_outliers: bool = False,
    holdout_flops: float | None = None,
    holdout_params: float | None = None,
    where: str | None = None,
) -> Forecast:
    """A forecast (module doc) from the FINISHED trials with a finite loss in `table` that
    `where` keeps (`results query`'s filter, before any target or hold-out is chosen);
    exactly one of size, flops, holdout, holdout_flops and holdout_params (the trials above
    this compute, or this many parameters, held out; the law through the rest).
    exclude_outliers: also the same forecast refitted without the points its check flags
    (`without_outliers`)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    given = (size, flops, holdout, holdout_flops, holdout_params)
    if sum(x is not None for x in given) != 1:
        raise ResultsError(
            "forecast: give exactly one of --target SIZE, --flops C, --holdout SIZE, "
            "--holdout-above-flops C, --holdout-above-params N"
        )
    from .query import filter_table
    from .usable import usable_trials

    if where:
        table = filter_table(table, where)
        if table.num_rows == 0:
            raise ResultsError(f"forecast: --where {where!r}: no trial of {sweep!r} matches")
    rows = usable_trials(table, loss, [])
    rows = rows.filter(pc.equal(rows["variant"], variant))
    if rows.num_rows == 0:
        raise ResultsError(f"forecast: no finished trials of variant {variant!r} in {sweep!r}")
    above = ("flops", holdout_flops) if holdout_flops is not None else None
    above = ("n_params", holdout_params) if holdout_params is not None else above
    goal = (size, flops, holdout, above)
    first = _forecast_rows(rows, sweep, variant, goal, loss, law, level)
    # an L(C) point is a cell: its label lists the cell's trials
    flagged = {t for o in first.law.check.outliers for t in o.label.split(", ")}
    if exclude_outliers and flagged:
        ids = np.array([str(t) for t in rows["trial_id"].to_pylist()])
        rest = rows.filter(pa.array(~np.isin(ids, sorted(flagged))))
        again = _forecast_rows(rest, sweep, variant, goal, loss, law, level)
        again.notes.insert(0, f"refitted without {len(flagged)} flagged point(s): "
                              + ", ".join(sorted(flagged)))  # fmt: skip
        return replace(first, without_outliers=again)
    return first


# the columns a hold-out above a threshold can go by: their option and unit, in words
ABOVE = {"flops": ("--holdout-above-flops", "FLOPs"),
         "n_params": ("--holdout-above-params", "parameters")}  # fmt: skip


def _forecast_rows(
    rows: pa.Table, sweep: str, variant: str,
    goal: tuple[str | None, float | None, str | None, tuple[str, float] | None],
    loss: str, law: str, level: float,
) -> Forecast:  # fmt: skip
    """The forecast of `goal`: (size, flops, holdout, (column, threshold) to hold out the
    trials above), exactly one given."""
    from scalelab.analysis.scaling import ScalingError, pareto_frontier

    size, flops, holdout, above = goal
    n, d, c, y = (_col(rows, k) for k in ("n_params", "tokens", "flops", loss))
    sizes = np.array(rows["size"].to_pylist())
    notes: list[str] = []
    try:
        if holdout is not None:
            if holdout not in set(sizes):
                raise ResultsError(
                    f"forecast: --holdout {holdout!r} was not run by {variant} "
                    f"(sizes: {', '.join(sorted(set(sizes)))})"
                )
            n_hold = n[sizes == holdout].min()
            train = n < n_hold
            smaller = sorted(set(sizes[train]), key=lambda s: n[sizes == s].min())
            if len(smaller) < 2:
                raise ResultsError(
                    f"forecast: --holdout {holdout}: needs 2 or more smaller sizes to fit a "
                    f"law, got {len(smaller)}"
                )
            fitted = _fit_cells(rows, train, loss, law, level)
            held = np.flatnonzero(sizes == holdout)
            held = held[np.argsort(d[held], kind="stable")]
            targets = [
                Target(f"{holdout} @ {d[i]:.3g} tokens", n[i], d[i], c[i], y[i]) for i in held
            ]
            on = f"{_sizes_text(smaller, n, sizes)} ({int(train.sum())} trials)"
            seen = y[train]
        elif above is not None:
            fitted, targets, on = _above(rows, *above, loss, law, level)
            seen = y[_col(rows, above[0]) <= above[1]]
            holdout = f"runs above {above[1]:.3g} {ABOVE[above[0]][1]}"
        elif size is not None:
            if any(c is None for c in rows["config"].to_pylist()):
                raise ResultsError(
                    "forecast: --target SIZE counts a size preset from the trials' configs, "
                    "which imported trials have not: use --flops C"
                )
            fitted = _fit_cells(rows, np.ones(rows.num_rows, bool), loss, law, level)
            targets = _size_targets(rows, size)
            on = f"{_sizes_text(set(sizes), n, sizes)} ({rows.num_rows} trials)"
            seen = y
        else:
            front = pareto_frontier(c, y)
            mask = np.zeros(rows.num_rows, bool)
            mask[front] = True
            fitted = _fit_cells(rows, mask, loss, "C", level)
            targets = [Target(f"C = {flops:.3g} FLOPs", float("nan"), float("nan"), float(flops))]
            on = f"the compute frontier ({mask.sum()} trials)"
            seen = y[mask]
        covariates = (
            ([t.n_params for t in targets], [t.tokens for t in targets])
            if fitted.covariates == ("N", "D")
            else ([t.flops for t in targets],)
        )
        predictions = fitted.predict(*covariates, level=level)
    except ScalingError as e:
        raise ResultsError(f"forecast: {e}") from None
    if fitted.check.fallback:
        notes.append(fitted.check.fallback)
    notes.extend(fitted.check.problems())
    notes.extend(_reach_notes(fitted, predictions, seen))
    return Forecast(sweep, variant, fitted, on, targets, predictions, holdout, notes,
                    seen_losses=(float(seen.min()), float(seen.max())))  # fmt: skip


MAX_SIZES_LISTED = 8


def _sizes_text(labels: object, n: np.ndarray, sizes: np.ndarray) -> str:
    """The sizes a law went through, smallest first: listed when few, else their count
    and range (an imported ladder has dozens)."""
    ordered = sorted(set(labels), key=lambda s: n[sizes == s].min())  # type: ignore[arg-type]
    if len(ordered) <= MAX_SIZES_LISTED:
        return ", ".join(ordered)
    return f"{len(ordered)} sizes, {ordered[0]} to {ordered[-1]}"


def _reach_notes(fitted: ForecastLaw, predictions: list[Prediction], seen: np.ndarray) -> list[str]:
    """How far the targets lie beyond the data and what widened their interval for it;
    an interval wider than the fitted runs' whole range of losses is said to be no forecast
    (docs/scaling.md, "Forecast")."""
    notes = []
    spreads = [p.spread for p in predictions if p.spread is not None]
    if spreads and max(s.distance for s in spreads) > 0:
        reach = getattr(fitted.law, "reach", None)
        if reach is None:
            notes.append(
                "the targets lie beyond the fitted runs, and too few sizes were fitted for a "
                "forward backtest (4 or more are needed): the interval holds only if the law "
                "holds out there"
            )
        else:
            q = fitted.law.per_distance
            notes.append(
                f"beyond the data: ± extrapolation is {q:.2%} of loss per unit of distance (log N "
                f"+ log D outside the fitted runs), the {fitted.law.level:.0%} quantile of the "
                f"errors of {reach.n_folds} forward backtests ({reach.distance.size} runs "
                "predicted from the smaller sizes only)"
                + (
                    f"; the folds on {fitted.law.calibrated_on:,} of the {fitted.law.stack.y.shape[1]:,} "
                    "rows, every size's token range kept"
                    if fitted.law.calibrated_on
                    else ""
                )
            )
    width = max((p.high - p.low for p in predictions), default=0.0)
    if seen.size and width > float(seen.max() - seen.min()):
        notes.append(
            f"NO USEFUL FORECAST: an interval is {width:.3g} wide, wider than the whole range of "
            f"the fitted runs' losses ({seen.min():.3g} to {seen.max():.3g}); fit more sizes "
            "nearer the target"
        )
    return notes


def _above(
    rows: pa.Table, column: str, threshold: float, loss: str, law: str, level: float
) -> tuple[ForecastLaw, list[Target], str]:
    """The law through the trials whose `column` (an ABOVE key) is at or below `threshold`;
    those above, the targets (in the column's order)."""
    n, d, c, y, x = (_col(rows, k) for k in ("n_params", "tokens", "flops", loss, column))
    option, unit = ABOVE[column]
    sizes = rows["size"].to_pylist()
    train = x <= threshold
    held = np.flatnonzero(~train)
    if held.size == 0:
        raise ResultsError(
            f"forecast: {option} {threshold:.3g}: no trial above it "
            f"(the largest has {x.max():.3g} {unit})"
        )
    if np.unique(n[train]).size < 2:
        raise ResultsError(
            f"forecast: {option} {threshold:.3g}: needs 2 or more sizes at or "
            f"below it to fit a law, got {np.unique(n[train]).size}"
        )
    held = held[np.lexsort((c[held], x[held]))]
    targets = [
        Target(f"{sizes[i]} @ {d[i]:.3g} tokens ({c[i]:.3g} FLOPs)", n[i], d[i], c[i], y[i])
        for i in held
    ]
    on = f"the {int(train.sum())} trials at or below {threshold:.3g} {unit}"
    return _fit_cells(rows, train, loss, law, level), targets, on


def _fit_cells(rows: pa.Table, mask: np.ndarray, loss: str, law: str, level: float) -> ForecastLaw:
    """The forecast law through the masked trials: L(N, D) through the trials themselves,
    as `results fit` does (one law per question); L(C) through the cell means (seeds
    averaged)."""
    from scalelab.analysis.scaling.loss_interval import fit_forecast_law

    keys: dict[tuple[float, float], list[int]] = {}
    n, d, c, y = (_col(rows, k) for k in ("n_params", "tokens", "flops", loss))
    for i in np.flatnonzero(mask):
        keys.setdefault((n[i], d[i]), []).append(int(i))
    groups = list(keys.values())
    rich = np.unique(n[mask]).size >= 3 and np.unique(d[mask]).size >= 3 and len(groups) >= 7
    if law == "ND" or (law == "auto" and rich):
        ids = [str(t) for t, m in zip(rows["trial_id"].to_pylist(), mask, strict=True) if m]
        return fit_forecast_law(n[mask], d[mask], c[mask], y[mask], law="ND", level=level,
                                labels=ids)  # fmt: skip
    return fit_forecast_law(
        np.array([n[g].mean() for g in groups]),
        np.array([d[g].mean() for g in groups]),
        np.array([c[g].mean() for g in groups]),
        np.array([np.exp(np.log(y[g]).mean()) for g in groups]),
        law=law,
        level=level,
        labels=[", ".join(str(rows["trial_id"][i]) for i in g) for g in groups],
    )


def _size_targets(rows: pa.Table, size: str) -> list[Target]:
    """The variant's token budgets at `size`: its parameters, tokens and FLOPs from the
    trials' own configs with the size swapped (orchestrator.plan.expand's resolution)."""
    from scalelab.jobs.config import JobConfig
    from scalelab.jobs.token_budget import total_tokens
    from scalelab.models.flops import count_params, train_flops_per_token
    from scalelab.models.sizes import get_size

    try:
        get_size(size)
    except ValueError as e:
        raise ResultsError(f"forecast: --target: {e}") from None
    seen: dict[str, Target] = {}
    for text in rows["config"].to_pylist():
        config = json.loads(text)
        model = dict(config["model"], size=size, n_layer=None, d_model=None, n_head=None)
        budget = json.dumps(
            {k: config["train"].get(k) for k in ("tokens", "tokens_per_param", "flops")}
        )
        if budget in seen:
            continue
        try:
            job = JobConfig.model_validate({**config, "model": model})
        except ValueError as e:
            from scalelab.contract.config import format_config_error

            why = format_config_error(e) if hasattr(e, "errors") else str(e)
            why = "; ".join(why.splitlines())
            raise ResultsError(f"forecast: --target {size}: {why}") from None
        n = count_params(job.model)
        tokens = total_tokens(job, n)
        flops = tokens * train_flops_per_token(job.model, job.data.seq_len)
        seen[budget] = Target(f"{size} @ {tokens:.3g} tokens", n, tokens, flops)
    return sorted(seen.values(), key=lambda t: t.tokens)


def _col(table: pa.Table, name: str) -> np.ndarray:
    return table[name].to_numpy(zero_copy_only=False).astype(float)
