"""`scalelab results sync|query|fit|plot|report SWEEP`: the aggregated results of a sweep.

Bad input (unknown sweep, nothing to fit, a bad --where) exits with code 2 and one line.
pyarrow, mlflow, scipy and matplotlib are imported inside the commands.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer
from rich.console import Console

from scalelab.cli.console import err, fail, stdout_console
from scalelab.cli.fit_options import (
    BUDGETS,
    HOLDOUT_FLOPS,
    HUBER,
    ISO_BINS,
    WHERE,
    fit_options,
)
from scalelab.cli.results_common import guard, say, synced
from scalelab.cli.wide_tables import print_table

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


@app.command("query")
def query_cmd(
    sweep: str = SWEEP,
    where: str | None = typer.Option(
        None, "--where", "-w", help="e.g. \"variant == 'dense' and size in ['nano', 'micro']\""
    ),
    group_by: str | None = typer.Option(
        None, "--group-by", "-g", help="Comma-separated columns, e.g. variant,size"
    ),
    metric: str | None = typer.Option(
        None, "--metric", "-m", help="Curve metric, e.g. val/loss, tsa/alpha"
    ),
    at: str = typer.Option("final", "--at", help="final | flops=1e18 | tokens=2e9 | step=500"),
    table: str = typer.Option(
        "trials", "--table", help="trials (one row per trial) or curves (every point)"
    ),
    fmt: str = typer.Option("table", "--format", "-f", help="table | csv | json | parquet"),
    output: Path | None = typer.Option(
        None, "--output", "-o", help="File to write (parquet: required)"
    ),
    columns: str | None = typer.Option(
        None, "--columns", "-c", help="Comma-separated columns to show"
    ),
    tracking_uri: str | None = URI,
) -> None:
    """Filter and aggregate a sweep's results (its tables brought up to date first)."""
    from scalelab.analysis.results import query

    if fmt not in ("table", "csv", "json", "parquet"):
        raise fail(f"--format {fmt!r}: expected table, csv, json or parquet")
    if fmt == "parquet" and output is None:
        raise fail("--format parquet needs --output FILE")
    groups = [g.strip() for g in group_by.split(",") if g.strip()] if group_by else None

    def run():  # noqa: ANN202
        import warnings

        from scalelab.analysis.results.query import ResultsWarning

        synced(sweep, tracking_uri)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ResultsWarning)
            result = query(sweep, where=where, group_by=groups, metric=metric, at=at, table=table)
        for w in caught:
            err.print(f"warning: {w.message}", highlight=False, markup=False, soft_wrap=True)
        if columns:
            wanted = [c.strip() for c in columns.split(",") if c.strip()]
            from scalelab.analysis.results.tables import ResultsError

            missing = [c for c in wanted if c not in result.column_names]
            if missing:
                raise ResultsError(
                    f"--columns: unknown {', '.join(missing)} (columns: {', '.join(result.column_names)})"
                )
            result = result.select(wanted)
        return result

    result = guard(run)
    try:
        _emit(result, fmt, output, chosen=bool(columns))
    except OSError as e:  # --output in a missing folder, a folder, no permission
        raise fail(f"--output {output}: cannot write ({e.strerror or e})") from None


def _emit(result, fmt: str, output: Path | None, chosen: bool = False) -> None:  # noqa: ANN001
    import pyarrow as pa

    for i, f in enumerate(result.schema):
        if pa.types.is_dictionary(f.type):
            result = result.set_column(i, f.name, result[f.name].cast(f.type.value_type))
    if fmt == "parquet":
        import pyarrow.parquet as pq

        pq.write_table(result, output, compression="zstd")
        console.print(f"wrote {result.num_rows} rows to {output}", highlight=False)
        return
    if fmt == "csv":
        import io

        import pyarrow.csv as pcsv

        buf = io.BytesIO()
        pcsv.write_csv(result, buf)
        text = buf.getvalue().decode()
    elif fmt == "json":
        text = _json(result)
    else:
        _print_table(result, output, chosen)
        return
    if output is not None:
        output.write_text(text)
        console.print(f"wrote {result.num_rows} rows to {output}", highlight=False)
    else:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")


def _json(result) -> str:  # noqa: ANN001
    import math

    def clean(v):  # noqa: ANN001, ANN202
        return None if isinstance(v, float) and not math.isfinite(v) else v

    rows = [{k: clean(v) for k, v in r.items()} for r in result.to_pylist()]
    return json.dumps(rows, indent=1, default=str)


# a trials table on screen without --columns: what it is, the settings that vary, the loss
SHOWN_FIRST = ("name", "trial_id", "variant", "size", "n_params", "tokens", "flops")
SHOWN_IF_VARIED = ("seed", "lr", "seq_len", "attn_out", "task", "data_source", "tsa_lambda",
                   "tsa_threshold", "budget_s_min", "budget_s_max", "budget_flops")  # fmt: skip
SHOWN_LAST = ("status", "steps", "final_val_loss", "best_val_loss", "wall_time_s", "queued_s",
              "value")  # fmt: skip
TIMES = ("wall_time_s", "queued_s")  # seconds, written as every view writes them


def default_columns(result) -> list[str]:  # noqa: ANN001
    """The trials table's columns worth a screen: SHOWN_FIRST, the settings that differ
    between the rows, SHOWN_LAST. Other tables (groups, curves) show every column."""
    names = result.column_names
    if "trial_id" not in names or "config" not in names:
        return list(names)
    varied = [c for c in SHOWN_IF_VARIED if c in names and len(set(result[c].to_pylist())) > 1]
    return [c for c in (*SHOWN_FIRST, *varied, *SHOWN_LAST) if c in names]


def _print_table(result, output: Path | None, chosen: bool = False) -> None:  # noqa: ANN001
    from rich.table import Table

    from scalelab.contract.trial_time import duration_text

    cols = list(result.column_names) if chosen else default_columns(result)
    caption = f"{result.num_rows} rows"
    if len(cols) < len(result.column_names):
        caption += (
            f"; {len(cols)} of {len(result.column_names)} columns (-c to choose, "
            "--format csv or json for all)"
        )
    table = Table(caption=caption)
    for c in cols:
        table.add_column(c, overflow="fold")
    for r in result.select(cols).to_pylist()[:500]:
        table.add_row(*[duration_text(r[c]) if c in TIMES else _cell(r[c]) for c in cols])
    if result.num_rows > 500:
        table.caption = caption.replace(
            f"{result.num_rows} rows", f"first 500 of {result.num_rows} rows (--format csv for all)"
        )
    if output:
        with open(output, "w") as f:
            Console(file=f).print(table)
    else:
        print_table(console, table)


def _cell(v: object) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, str) and len(v) == 16 and all(ch in "0123456789abcdef" for ch in v):
        return v[:8]  # trial ids: the first 8 hex digits are enough on screen
    return str(v)


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
    from scalelab.analysis.report import report_lines, write_report
    from scalelab.analysis.results import sweep_dir
    from scalelab.analysis.results.imports import imported_only

    options = fit_options(budget, huber_delta, holdout_flops, isoflop_bin_width)
    fit, files, _, uri = guard(
        lambda: _fit_and_plot(sweep, baseline, resamples, tracking_uri, where=where, **options)
    )
    uri = "" if imported_only(sweep) else uri  # no MLflow record to point at
    report = guard(lambda: write_report(fit, files, sweep_dir(sweep), uri))
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
