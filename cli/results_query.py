"""`scalelab results query SWEEP`: filter and aggregate a sweep's results tables, printed
as a table (the columns that say what a trial is, those its sweep varied, and its outcome)
or written as CSV, JSON or Parquet (analysis/results/query.py; docs/results.md)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer
from rich.console import Console

from scalelab.cli.console import err, fail, stdout_console
from scalelab.cli.results_common import guard, synced
from scalelab.cli.wide_tables import print_table

console = stdout_console(160)


def query_cmd(
    sweep: str = typer.Argument(..., help="Sweep name (the MLflow experiment)."),
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
    tracking_uri: str | None = typer.Option(
        None, "--tracking-uri", help="MLflow tracking URI (default: the work directory's)."
    ),
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
