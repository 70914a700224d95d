"""Forecasts of a downstream accuracy column (`eval_<task>_acc`, `_acc_norm`, or
`eval_mean_acc`, the mean over the tasks every run has) for a synced or imported sweep,
by the two laws of analysis.scaling.task_laws, each with its backtest on the ladder's
largest fitted size (docs/evaluation.md, "Forecasting task accuracy").

The ladder: the laws in compute hold at a fixed number of tokens per parameter R, so of
each size's runs (a sweep's token budgets, a published suite's checkpoints) the ones whose
D/N is nearest R go through the compute law; R is `tokens_per_param`, else the largest D/N
of the largest held-out (or, without a hold-out, fitted) size. The sigmoid of step 2 goes
through every fitted run that has both a loss and an accuracy.

The intermediate loss of two-step: the task's correct-answer loss, the first column found
of `eval_<task>_bpb`, `_nll`, `_loss` or `_perplexity` (its log); else the validation loss
(`final_val_loss`), and the forecast says so.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from .loss_forecast import ABOVE, Target
from .tables import ResultsError

if TYPE_CHECKING:
    import pyarrow as pa

    from scalelab.analysis.scaling.task_laws import TaskLaw, TaskPrediction

MEAN = "eval_mean_acc"
ACC = re.compile(r"^eval_(?P<task>.+?)_(?P<kind>acc|acc_norm)$")
LOSSES = ("bpb", "nll", "loss", "perplexity")  # correct-answer losses, in order of preference
METHODS = ("two-step", "direct")


@dataclass(frozen=True, eq=False)
class Backtest:
    """The law refitted without the largest fitted size, and that size's runs predicted."""

    size: str
    targets: list[Target]
    predictions: list[TaskPrediction]

    @property
    def errors(self) -> list[float]:
        return [p.acc - t.actual for t, p in zip(self.targets, self.predictions, strict=True)]

    @property
    def covered(self) -> list[bool]:
        return [t.actual in p for t, p in zip(self.targets, self.predictions, strict=True)]


@dataclass(frozen=True, eq=False)
class MethodForecast:
    method: str
    law: TaskLaw | None
    predictions: list[TaskPrediction]
    refusal: str | None = None  # why this method gives no forecast, in one line
    backtest: Backtest | None = None
    backtest_refusal: str | None = None


@dataclass(frozen=True, eq=False)
class TaskForecast:
    sweep: str
    variant: str
    metric: str
    tokens_per_param: float
    fitted_on: str
    targets: list[Target]
    methods: list[MethodForecast]
    holdout: str | None = None
    notes: list[str] = field(default_factory=list)

    def title(self) -> str:
        what = f"backtest on {self.holdout}" if self.holdout else "forecast"
        what = what if self.targets else "backtest on the largest fitted size"
        return (f"{self.metric} of {self.variant}, {what}: ladder at {self.tokens_per_param:.3g} "
                f"tokens per parameter, through {self.fitted_on}")  # fmt: skip

    def to_dict(self) -> dict[str, Any]:
        from .export import num

        def preds(targets: list[Target], ps: list[TaskPrediction]) -> list[dict[str, Any]]:
            return [{"label": t.label, "n_params": num(t.n_params), "tokens": num(t.tokens),
                     "flops": num(t.flops), "predicted": num(p.acc), "low": num(p.low),
                     "high": num(p.high), "level": p.level,
                     "actual": num(t.actual) if np.isfinite(t.actual) else None,
                     "covered": (t.actual in p) if np.isfinite(t.actual) else None}
                    for t, p in zip(targets, ps, strict=True)]  # fmt: skip

        return {
            "sweep": self.sweep, "variant": self.variant, "metric": self.metric,
            "tokens_per_param": num(self.tokens_per_param), "fitted_on": self.fitted_on,
            "holdout": self.holdout, "notes": self.notes,
            "methods": [{
                "method": m.method, "refusal": m.refusal,
                "form": m.law.form if m.law else None,
                "constants": {k: num(v) for k, v in m.law.constants.items()} if m.law else None,
                "targets": preds(self.targets, m.predictions),
                "backtest": None if m.backtest is None else {
                    "size": m.backtest.size,
                    "targets": preds(m.backtest.targets, m.backtest.predictions)},
                "backtest_refusal": m.backtest_refusal,
            } for m in self.methods],
        }  # fmt: skip


@dataclass(frozen=True)
class _Runs:
    """The columns a task forecast reads, one entry per usable run."""

    label: np.ndarray  # size labels
    n: np.ndarray
    d: np.ndarray
    c: np.ndarray
    acc: np.ndarray
    stderr: np.ndarray | None
    loss: np.ndarray | None  # the intermediate loss of two-step
    chance: float | None


def task_forecast_table(
    table: pa.Table, sweep: str, metric: str, *, variant: str = "dense",
    flops: float | None = None, holdout: str | None = None,
    holdout_flops: float | None = None, holdout_params: float | None = None,
    where: str | None = None, tokens_per_param: float | None = None,
    methods: tuple[str, ...] = METHODS, level: float = 0.95,
    n_resamples: int | None = None, seed: int = 0,
) -> TaskForecast:  # fmt: skip
    """The forecast of `metric` (module doc): at most one of flops (a compute budget),
    holdout (a size that was run), holdout_flops / holdout_params (the runs above this
    compute or size held out); none: the backtest on the largest size alone. ResultsError
    in one line where accuracy sits at chance over the ladder."""
    from scalelab.analysis.scaling.task_laws import N_RESAMPLES, chance_refusal

    if sum(x is not None for x in (flops, holdout, holdout_flops, holdout_params)) > 1:
        raise ResultsError(
            "forecast: give at most one of --flops C, --holdout SIZE, "
            "--holdout-above-flops C, --holdout-above-params N"
        )
    notes: list[str] = []
    runs = _read_runs(table, sweep, metric, variant, where, notes)
    train = np.ones(runs.n.size, bool)
    held = np.zeros(runs.n.size, bool)
    what = None
    if holdout is not None:
        if holdout not in set(runs.label):
            raise ResultsError(f"forecast: --holdout {holdout!r} was not run by {variant} "
                               f"(sizes: {', '.join(sorted(set(runs.label)))})")  # fmt: skip
        held = runs.label == holdout
        what = holdout
    for column, threshold in (("flops", holdout_flops), ("n_params", holdout_params)):
        if threshold is not None:
            held = (runs.c if column == "flops" else runs.n) > threshold
            what = f"runs above {threshold:.3g} {ABOVE[column][1]}"
    train = runs.n < runs.n[held].min() if held.any() else ~held
    if what is not None and not held.any():
        raise ResultsError(f"forecast: no run of {variant} in {what}")
    top = held if held.any() else train
    biggest = runs.n[top] == runs.n[top].max()
    ratio = tokens_per_param or float((runs.d[top][biggest] / runs.n[top][biggest]).max())
    ladder = _nearest_ratio(runs, ratio)
    fit_ladder = ladder & train
    refusal = chance_refusal(runs.label[fit_ladder], runs.acc[fit_ladder],
                             None if runs.stderr is None else runs.stderr[fit_ladder],
                             runs.chance)  # fmt: skip
    if refusal:
        raise ResultsError(f"no forecast of {metric}: {refusal}")
    if flops is not None:
        targets = [Target(f"C = {flops:.3g} FLOPs", float("nan"), float("nan"), float(flops))]
    else:
        targets = _targets(runs, ladder & held)
    sizes = len(set(runs.label[fit_ladder]))
    fitted_on = (
        f"{sizes} sizes ({int(fit_ladder.sum())} runs at the ratio, {int(train.sum())} in all)"
    )
    b = n_resamples or N_RESAMPLES
    out = []
    for method in methods:
        law, preds, why = _fit_predict(method, runs, fit_ladder, train, targets, level, b, seed)
        back, back_why = _backtest(method, runs, fit_ladder, train, level, b, seed)
        out.append(MethodForecast(method, law, preds, why, back, back_why))
    return TaskForecast(sweep, variant, metric, ratio, fitted_on, targets, out, what, notes)


def _read_runs(
    table: pa.Table, sweep: str, metric: str, variant: str, where: str | None, notes: list[str]
) -> _Runs:
    import pyarrow.compute as pc

    from scalelab.analysis.scaling.task_laws import CHANCE
    from scalelab.contract.runs import Status

    from .query import filter_table

    if where:
        table = filter_table(table, where)
    table = table.filter(pc.and_(pc.equal(table["status"], Status.FINISHED),
                                 pc.equal(table["variant"], variant)))  # fmt: skip
    if table.num_rows == 0:
        raise ResultsError(f"forecast: no finished trials of variant {variant!r} in {sweep!r}")
    names = table.column_names
    if metric == MEAN:
        tasks = sorted(m["task"] for c in names if (m := ACC.match(c)) and m["kind"] == "acc")
        kind = "acc"
        if not tasks:
            raise ResultsError(f"forecast: {sweep!r} has no eval_<task>_acc column to average")
        notes.append(f"{MEAN}: the mean of {len(tasks)} tasks' accuracy ({', '.join(tasks)})")
    else:
        m = ACC.match(metric)
        if m is None or metric not in names:
            have = ", ".join(c for c in names if ACC.match(c)) or "none"
            raise ResultsError(f"forecast: no accuracy column {metric!r} (have: {have}, "
                               f"and {MEAN})")  # fmt: skip
        tasks, kind = [m["task"]], m["kind"]

    def col(name: str) -> np.ndarray:
        return table[name].to_numpy(zero_copy_only=False).astype(float)

    acc = np.mean([col(f"eval_{t}_{kind}") for t in tasks], axis=0)
    errs = [f"eval_{t}_{kind}_stderr" for t in tasks]
    stderr = (np.sqrt(np.sum([col(e) ** 2 for e in errs], axis=0)) / len(tasks)
              if all(e in names for e in errs) else None)  # fmt: skip
    chances = [CHANCE.get(t) for t in tasks]
    chance = None if None in chances else float(np.mean(chances))  # type: ignore[arg-type]
    losses = [_task_loss(t, names) for t in tasks]
    if all(x is not None for x in losses):
        loss = np.mean([np.log(col(c)) if c.endswith("perplexity") else col(c)
                        for c in losses], axis=0)  # type: ignore[union-attr]  # fmt: skip
        notes.append(f"two-step goes through the correct-answer loss {', '.join(losses)}")  # type: ignore[arg-type]
    elif "final_val_loss" in names and np.isfinite(col("final_val_loss")).any():
        loss = col("final_val_loss")
        notes.append(f"no correct-answer loss (eval_<task>_{'/'.join(LOSSES)}) for "
                     f"{metric}: two-step goes through the validation loss instead")  # fmt: skip
    else:
        loss = None
    ok = np.isfinite(acc) & (acc > 0) & (acc < 1)
    if not ok.any():
        raise ResultsError(f"forecast: no finished trial of {variant} has a value of {metric}")
    return _Runs(np.array(table["size"].to_pylist())[ok], col("n_params")[ok],
                 col("tokens")[ok], col("flops")[ok], acc[ok],
                 None if stderr is None else stderr[ok],
                 None if loss is None else loss[ok], chance)  # fmt: skip


def _task_loss(task: str, names: list[str]) -> str | None:
    return next((f"eval_{task}_{k}" for k in LOSSES if f"eval_{task}_{k}" in names), None)


def _nearest_ratio(runs: _Runs, ratio: float) -> np.ndarray:
    """Per size, the runs whose D/N is nearest `ratio` in log (within 1%: seeds)."""
    gap = np.abs(np.log(runs.d / runs.n / ratio))
    out = np.zeros(gap.size, bool)
    for size in set(runs.label):
        m = runs.label == size
        out |= m & (gap <= gap[m].min() + 0.01)
    return out


def _targets(runs: _Runs, mask: np.ndarray) -> list[Target]:
    idx = np.flatnonzero(mask)
    idx = idx[np.lexsort((runs.d[idx], runs.n[idx]))]
    return [Target(f"{runs.label[i]} @ {runs.d[i]:.3g} tokens", runs.n[i], runs.d[i],
                   runs.c[i], runs.acc[i]) for i in idx]  # fmt: skip


def _fit_predict(
    method: str, runs: _Runs, ladder: np.ndarray, train: np.ndarray, targets: list[Target],
    level: float, n_resamples: int, seed: int,
) -> tuple[TaskLaw | None, list[TaskPrediction], str | None]:  # fmt: skip
    """The method's law through the fitted runs and its predictions; or its refusal."""
    from scalelab.analysis.scaling import ScalingError
    from scalelab.analysis.scaling.task_laws import fit_direct, fit_two_step

    try:
        if method == "direct":
            law = fit_direct(runs.c[ladder], runs.acc[ladder], n_resamples=n_resamples,
                             seed=seed)  # fmt: skip
        elif runs.loss is None:
            return (
                None,
                [],
                "no intermediate loss: neither a correct-answer loss nor final_val_loss",
            )
        else:
            both = train & np.isfinite(runs.loss)
            step1 = ladder & np.isfinite(runs.loss)
            law = fit_two_step(runs.c[step1], runs.loss[step1], runs.loss[both], runs.acc[both],
                               chance=runs.chance or 0.0, n_resamples=n_resamples,
                               seed=seed)  # fmt: skip
    except ScalingError as e:
        return None, [], str(e)
    return law, law.predict([t.flops for t in targets], level=level) if targets else [], None


def _backtest(
    method: str, runs: _Runs, ladder: np.ndarray, train: np.ndarray, level: float,
    n_resamples: int, seed: int,
) -> tuple[Backtest | None, str | None]:  # fmt: skip
    """Fit without the largest fitted size, predict its runs at the ladder's ratio."""
    top = runs.n[ladder].max()
    big = runs.n >= top
    held = ladder & big
    targets = _targets(runs, held)
    from scalelab.analysis.scaling.task_laws import chance_refusal

    fit = ladder & ~big
    stderr = None if runs.stderr is None else runs.stderr[fit]
    refusal = chance_refusal(runs.label[fit], runs.acc[fit], stderr, runs.chance)
    if refusal:
        return None, refusal
    law, preds, why = _fit_predict(method, runs, ladder & ~big, train & ~big, targets, level,
                                   n_resamples, seed)  # fmt: skip
    if law is None:
        return None, why
    return Backtest(str(runs.label[held][0]), targets, preds), None
