"""`scalelab results forecast SWEEP --metric eval_<task>_acc`: a downstream accuracy of
larger runs by two laws (two-step through the task's loss, and direct), each with its
interval and its backtest on the ladder's largest fitted size
(analysis/results/task_forecast.py; docs/evaluation.md, "Forecasting task accuracy").
"""

from __future__ import annotations

from typing import Any

from scalelab.cli.console import stdout_console

console = stdout_console(160)


def print_task_forecast(result: Any, level: float) -> None:  # noqa: ANN401
    """One table per method (its forecast and its backtest rows), or its one-line refusal."""
    from rich.table import Table

    console.print(result.title(), highlight=False)
    for m in result.methods:
        if m.refusal is not None:
            console.print(f"[bold]{m.method}[/]: no forecast: {m.refusal}", highlight=False)
        else:
            _print_rows(Table, f"{m.method}: {m.law.form}", result.targets, m.predictions, level)
        if m.backtest is not None:
            bt = m.backtest
            _print_rows(Table, f"{m.method} backtest: {bt.size} predicted from the smaller "
                        "sizes", bt.targets, bt.predictions, level)  # fmt: skip
            errs = bt.errors
            console.print(
                f"{m.method} backtest on {bt.size}: error {_signed(errs)}, "
                f"{sum(bt.covered)} of {len(errs)} inside the {level:.0%} interval",
                highlight=False,
            )
        elif m.backtest_refusal is not None:
            console.print(f"{m.method} backtest: none: {m.backtest_refusal}", highlight=False)
    for note in result.notes:
        console.print(f"[yellow]note:[/] {note}", highlight=False)


def _signed(errors: list[float]) -> str:
    return ", ".join(f"{e:+.3f}" for e in errors)


def _print_rows(table_cls: Any, title: str, targets: list, predictions: list,  # noqa: ANN401
                level: float) -> None:  # fmt: skip
    if not targets:
        return
    table = table_cls(title=title, title_justify="left")
    held = any(t.actual == t.actual for t in targets)  # NaN != NaN: a target not run
    head = ["run", "predicted", f"{level:.0%} interval"] + (["actual", "covered"] if held else [])
    for h in head:
        table.add_column(h, justify="left" if h == "run" else "right")
    for t, p in zip(targets, predictions, strict=True):
        row = [t.label, f"{p.acc:.3f}", f"[{p.low:.3f}, {p.high:.3f}]"]
        if held:
            row += [f"{t.actual:.3f}", "yes" if t.actual in p else "NO"]
        table.add_row(*row)
    console.print(table)


def run_task_forecast(
    sweep: str, metric: str, method: str, tracking_uri: str | None, as_json: bool,
    level: float, **options: Any,  # noqa: ANN401
) -> None:  # fmt: skip
    """The --metric path of `results forecast`: forecast, then print it (or its JSON)."""
    import json

    from scalelab.analysis.results import load_trials
    from scalelab.analysis.results.task_forecast import METHODS, task_forecast_table
    from scalelab.cli.console import fail
    from scalelab.cli.results_common import guard, synced

    if method not in (*METHODS, "both"):
        raise fail(f"--method {method!r}: expected two-step, direct or both")
    if options.get("tokens_per_param") is not None and not options["tokens_per_param"] > 0:
        raise fail("--tokens-per-param: expected a positive number")
    methods = METHODS if method == "both" else (method,)

    def run():  # noqa: ANN202
        synced(sweep, tracking_uri)
        return task_forecast_table(load_trials(sweep), sweep, metric, methods=methods,
                                   level=level, **options)  # fmt: skip

    result = guard(run)
    if as_json:
        print(json.dumps(result.to_dict(), indent=1, allow_nan=False))
        return
    print_task_forecast(result, level)
