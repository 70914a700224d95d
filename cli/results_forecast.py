"""`scalelab results forecast SWEEP`: the final loss of a run not made, with a prediction
interval whose parts are printed (analysis/results/loss_forecast.py; docs/scaling.md,
"Forecast"). "beyond data" is how far the target lies outside the fitted runs, as a factor
exp(delta) on N x D; "± extrapolation" is what forward backtests measured at that distance.
"""

from __future__ import annotations

import json
import math

import typer

from scalelab.cli.console import fail, stdout_console
from scalelab.cli.fit_options import FORECAST_WHERE, HOLDOUT_PARAMS, positive
from scalelab.cli.results_common import guard, say

console = stdout_console(160)


def forecast_cmd(
    sweep: str = typer.Argument(..., help="Sweep name (the MLflow experiment)."),
    target: str | None = typer.Option(
        None, "--target", help="A larger size preset to forecast, at each token budget"
    ),
    flops: float | None = typer.Option(
        None, "--flops", help="A compute budget (FLOPs): the law through the compute frontier"
    ),
    holdout: str | None = typer.Option(
        None, "--holdout", help="A size that was run: forecast it from the smaller sizes"
    ),
    holdout_flops: float | None = typer.Option(
        None,
        "--holdout-above-flops",
        help="Forecast the trials above this compute (FLOPs) from the others",
    ),  # fmt: skip
    holdout_params: float | None = HOLDOUT_PARAMS,
    where: str | None = FORECAST_WHERE,
    variant: str = typer.Option("dense", "--variant", "-v", help="The variant to forecast."),
    law: str = typer.Option("auto", "--law", help="auto | C (L(C)) | ND (Chinchilla's L(N, D))"),
    level: float = typer.Option(0.95, "--level", help="Level of the prediction interval."),
    loss: str = typer.Option("final_val_loss", "--loss", help="final_val_loss or best_val_loss"),
    metric: str | None = typer.Option(
        None,
        "--metric",
        help="A downstream accuracy to forecast instead of the loss: "
        "eval_<task>_acc, eval_<task>_acc_norm or eval_mean_acc (docs/evaluation.md)",
    ),  # fmt: skip
    method: str = typer.Option("both", "--method", help="--metric: two-step | direct | both"),
    tokens_per_param: float | None = typer.Option(
        None, "--tokens-per-param", help="--metric: the ladder's D/N (default: the target's)"
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    exclude_outliers: bool = typer.Option(
        False,
        "--exclude-outliers",
        help="Also refit without the points the check flags; print both.",
    ),
    tracking_uri: str | None = typer.Option(
        None, "--tracking-uri", help="MLflow tracking URI (default: the work directory's)."
    ),
) -> None:
    """Forecast the final loss of a larger run from the smaller ones, with a prediction
    interval; --holdout backtests it on a size that was run."""
    from scalelab.analysis import door

    if law not in ("auto", "C", "ND"):
        raise fail(f"--law {law!r}: expected auto, C or ND")
    if not 0 < level < 1:
        raise fail(f"--level {level}: expected a number between 0 and 1")
    positive(("--holdout-above-flops", holdout_flops), ("--holdout-above-params", holdout_params))
    if metric is not None:
        if target is not None:
            raise fail("--metric: --target SIZE counts a preset's parameters; use --flops C")
        from scalelab.cli.results_task_forecast import run_task_forecast

        return run_task_forecast(sweep, metric, method, tracking_uri, as_json, level,
                                 variant=variant, flops=flops, holdout=holdout,
                                 holdout_flops=holdout_flops, holdout_params=holdout_params,
                                 where=where, tokens_per_param=tokens_per_param)  # fmt: skip

    def run():  # noqa: ANN202
        return door.forecast(sweep, tracking_uri=tracking_uri, said=say, variant=variant,
                             size=target, flops=flops, holdout=holdout, loss=loss, law=law,
                             level=level, exclude_outliers=exclude_outliers,
                             holdout_flops=holdout_flops, holdout_params=holdout_params,
                             where=where)  # fmt: skip

    result = guard(run)
    if as_json:
        print(json.dumps(result.to_dict(), indent=1, allow_nan=False))
        return
    for shown in (result, result.without_outliers):
        if shown is not None:
            _print_forecast(shown, level)


def _print_forecast(result, level: float) -> None:  # noqa: ANN001
    from rich.table import Table

    check = result.law.check
    table = Table(
        title=result.title(),
        caption=f"fit check: {check.summary()}; residuals up to {check.max_residual:.1%}",
        title_justify="left",
    )
    spread = result.predictions[0].spread is not None
    head = ["run", "predicted", f"{level:.0%} prediction interval"]
    head += (
        ["beyond data", "± parameters", "± scatter", "± misfit", "± extrapolation"]
        if spread
        else []
    )
    held = result.holdout is not None
    head += ["actual", "covered"] if held else []
    for h in head:
        table.add_column(h, justify="left" if h == "run" else "right")
    for t, p in zip(result.targets, result.predictions, strict=True):
        shown = f"[{p.low:.4g}, {p.high:.4g}]" if result.useful(p) else "no useful forecast"
        row = [t.label, f"{p.loss:.4g}", shown]
        if p.spread is not None:  # half-widths in log L, i.e. about a share of the loss
            s = p.spread
            beyond = f"×{math.exp(s.distance):.2g}" if s.distance > 0 else "inside"
            row += [beyond, f"{s.parameter:.2%}", f"{s.scatter:.2%}", f"{s.misfit:.2%}",
                    f"{s.extrapolation:.2%}"]  # fmt: skip
        if held:
            row += [f"{t.actual:.4g}", "yes" if t.actual in p else "NO"]
        table.add_row(*row)
    console.print(table)
    for note in result.notes:
        console.print(f"[yellow]note:[/] {note}", highlight=False)
