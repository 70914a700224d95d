"""`scalelab results sync|query|fit|plot|report SWEEP`: the aggregated results of a sweep.

Bad input (unknown sweep, nothing to fit, a bad --where) exits with code 2 and one line.
pyarrow, mlflow, scipy and matplotlib are imported inside the commands.
"""

from __future__ import annotations

import json

import typer

from scalelab.cli.console import fail, stdout_console
from scalelab.cli.fit_options import (
    BUDGETS,
    HOLDOUT_FLOPS,
    HUBER,
    ISO_BINS,
    WHERE,
    fit_options,
)
from scalelab.cli.results_common import guard, say

app = typer.Typer(
    help="Aggregated results of a sweep: Parquet tables, queries, scaling fits, plots, report.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = stdout_console(160)

SWEEP = typer.Argument(..., help="Sweep name (the MLflow experiment).")
URI = typer.Option(
    None, "--tracking-uri", help="MLflow tracking URI (default: the work directory's)."
)
BASELINE = typer.Option("dense", "--baseline", "-b", help="Variant the others are compared with.")
RESAMPLES = typer.Option(1000, "--resamples", help="Bootstrap resamples for the intervals.")
EXCLUDE_OUTLIERS = typer.Option(
    False, "--exclude-outliers", help="Also refit without the points the check flags; print both."
)


@app.command("sync")
def sync_cmd(sweep: str = SWEEP, tracking_uri: str | None = URI) -> None:
    """Build or refresh the sweep's `trials` and `curves` Parquet tables (incremental)."""
    from scalelab.analysis.results import sync

    result = guard(lambda: sync(sweep, tracking_uri))
    console.print(str(result), highlight=False)
    console.print(f"trials: {result.trials_path}\ncurves: {result.curves_path}", highlight=False)


from scalelab.cli.results_query import query_cmd  # noqa: E402

app.command("query")(query_cmd)


@app.command("fit")
def fit_cmd(
    sweep: str = SWEEP,
    baseline: str = BASELINE,
    loss: str = typer.Option("final_val_loss", "--loss", help="final_val_loss or best_val_loss"),
    resamples: int = RESAMPLES,
    where: str | None = WHERE,
    budget: str | None = BUDGETS,
    huber_delta: float | None = HUBER,
    holdout_flops: float | None = HOLDOUT_FLOPS,
    isoflop_bin_width: float | None = ISO_BINS,
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of tables."),
    exclude_outliers: bool = EXCLUDE_OUTLIERS,
    tracking_uri: str | None = URI,
) -> None:
    """Scaling laws per variant, the compute-equivalent gain vs the baseline with bootstrap
    intervals, per-size differences, and the compute-optimal allocation at --budget."""
    from scalelab.analysis.results.render import rich_tables

    options = fit_options(budget, huber_delta, holdout_flops, isoflop_bin_width)

    def run():  # noqa: ANN202
        return _fit(sweep, where, tracking_uri, baseline=baseline, loss=loss,
                    n_resamples=resamples, exclude_outliers=exclude_outliers,
                    **options)  # fmt: skip

    fit = guard(run)
    if as_json:
        print(json.dumps(fit.to_dict(), indent=1))
        return
    for table in rich_tables(fit):
        console.print(table)
    for note in fit.notes:
        console.print(f"[yellow]note:[/] {note}", highlight=False)


def _fit(sweep: str, where: str | None, tracking_uri: str | None, **options: object):  # noqa: ANN202
    """The results door's fit (tables brought up to date first) on the trials `where` keeps,
    each literal compared in its column's own type (`tokens >= 1e9` on an int64 column)."""
    from scalelab.analysis import door

    return door.fit(sweep, where=where, tracking_uri=tracking_uri, said=say, **options)


def _fit_and_plot(sweep: str, baseline: str, resamples: int, tracking_uri: str | None,
                  where: str | None = None, **options: object):  # noqa: ANN202  # fmt: skip
    """Fit and plot; the plots go on the sweep's parent run when it has one (an imported
    sweep has none)."""
    from scalelab.analysis import plots
    from scalelab.analysis.results import sweep_dir
    from scalelab.analysis.results.imports import curves_of, parent_run
    from scalelab.contract import workdir

    fit = _fit(sweep, where, tracking_uri, baseline=baseline, n_resamples=resamples, **options)
    files = plots.make_plots(fit, curves_of(sweep), sweep_dir(sweep) / "plots")
    uri = tracking_uri or workdir.tracking_uri()
    logged = plots.log_plots(parent_run(sweep, uri), files, uri)
    return fit, files, logged, uri


@app.command("plot")
def plot_cmd(
    sweep: str = SWEEP,
    baseline: str = BASELINE,
    resamples: int = RESAMPLES,
    where: str | None = WHERE,
    tracking_uri: str | None = URI,
) -> None:
    """PNG plots into results/<sweep>/plots, attached to the sweep's MLflow parent run."""
    _, files, logged, _ = guard(
        lambda: _fit_and_plot(sweep, baseline, resamples, tracking_uri, where=where)
    )
    for path in files.values():
        console.print(str(path), highlight=False)
    if logged:
        console.print("(also logged as artifacts plots/* on the sweep's MLflow parent run)")


@app.command("report")
def report_cmd(
    sweep: str = SWEEP,
    baseline: str = BASELINE,
    resamples: int = RESAMPLES,
    where: str | None = WHERE,
    budget: str | None = BUDGETS,
    huber_delta: float | None = HUBER,
    holdout_flops: float | None = HOLDOUT_FLOPS,
    isoflop_bin_width: float | None = ISO_BINS,
    tracking_uri: str | None = URI,
) -> None:
    """One Markdown report (tables + plots) at results/<sweep>/report.md, and report.html
    beside it (the same, its plots embedded: open it in a browser)."""
    from scalelab.analysis.report import report_lines, tuned_lines, write_report
    from scalelab.analysis.results import sweep_dir
    from scalelab.analysis.results.imports import imported_only
    from scalelab.analysis.results.tables import ResultsError

    options = fit_options(budget, huber_delta, holdout_flops, isoflop_bin_width)

    def fitted():  # noqa: ANN202
        try:
            return _fit_and_plot(sweep, baseline, resamples, tracking_uri, where=where, **options)
        except ResultsError:  # no law: a tuned sweep still has its gaps at both rates
            for line in tuned_lines(sweep, None, baseline, where=where):
                console.print(line, highlight=False, soft_wrap=True)
            raise

    fit, files, _, uri = guard(fitted)
    tuned = guard(lambda: tuned_lines(sweep, fit, baseline, where=where))
    uri = "" if imported_only(sweep) else uri  # no MLflow record to point at
    report = guard(lambda: write_report(fit, files, sweep_dir(sweep), uri, tuned))
    for line in report_lines(report):
        console.print(line, highlight=False, soft_wrap=True)


@app.command("summary")
def summary_cmd(
    sweep: str = SWEEP,
    baseline: str = BASELINE,
    resamples: int = RESAMPLES,
    tracking_uri: str | None = URI,
) -> None:
    """sync + fit + plot + report in one go, printing the gains and where everything is."""
    from scalelab.analysis.report import summarise_sweep

    text = guard(
        lambda: summarise_sweep(
            sweep, tracking_uri, baseline=baseline, n_resamples=resamples, width=console.width
        )
    )
    console.print(text, end="", highlight=False, markup=False)


@app.command("advise")
def advise_cmd(
    sweep: str = SWEEP,
    baseline: str = BASELINE,
    effect: float = typer.Option(
        0.05, "--effect", help="The compute gain to tell from none (0.05 = 5%)."
    ),
    power: float = typer.Option(0.8, "--power", help="The chance of telling it, if it is real."),
    level: float = typer.Option(0.95, "--level", help="Level of the interval."),
    loss: str = typer.Option("final_val_loss", "--loss", help="final_val_loss or best_val_loss"),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of text."),
    tracking_uri: str | None = URI,
) -> None:
    """What to run next: how many more seeds, or which extra size or budget, would let the
    paired gain tell a given compute gain from none, and what it costs."""
    from scalelab.analysis.results.advice import advice_lines, costing
    from scalelab.analysis.results.export import advice_dict

    if not 0 < effect < 1:
        raise fail(f"--effect {effect}: expected a fraction between 0 and 1 (0.05 = 5%)")
    if not 0 < power < 1 or not 0 < level < 1:
        raise fail("--power and --level: expected numbers between 0 and 1")

    def run():  # noqa: ANN202
        return _fit(sweep, None, tracking_uri, baseline=baseline, loss=loss, level=level,
                    effect=effect, power=power, resample=False)  # fmt: skip

    fit = guard(run)
    if not fit.advice:
        raise fail(
            "no advice: no variant has a paired gain against the baseline ("
            + ("; ".join(fit.notes) or "one variant only")
            + ")"
        )
    cost = costing(fit.table)
    if as_json:
        out = []
        for a in fit.advice:
            item = advice_dict(a)
            item["gain"] = str(fit.paired_gain(a.variant))
            if a.best is not None:
                item["best"]["cost"] = cost.describe(a.best.option.cost_flops)
            if a.for_measured is not None:
                item["for_measured"]["cost"] = cost.describe(a.for_measured.option.cost_flops)
            out.append(item)
        print(json.dumps(out, indent=1, allow_nan=False))
        return
    for a in fit.advice:
        console.print(str(fit.paired_gain(a.variant)), highlight=False)
        for line in advice_lines(a, cost):
            console.print(f"  next: {line}", highlight=False)


from scalelab.cli.results_forecast import forecast_cmd  # noqa: E402

app.command("forecast")(forecast_cmd)
from scalelab.cli.results_import import import_cmd  # noqa: E402

app.command("import")(import_cmd)
from scalelab.cli.results_compare import compare_cmd  # noqa: E402

app.command("compare")(compare_cmd)
