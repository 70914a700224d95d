"""`scalelab results import FILE --sweep NAME`: another ladder's points as a sweep's trials
(analysis/results/imports.py; docs/results.md, "Importing results")."""

from __future__ import annotations

from pathlib import Path

import typer

from scalelab.cli.console import fail, stdout_console

console = stdout_console(160)


def import_cmd(
    file: Path = typer.Argument(
        ..., help="CSV, Parquet or JSON Lines: one row per trial (N, D or C, loss; optional "
        "variant, seed, size, budget, name).", show_default=False,
    ),
    sweep: str = typer.Option(..., "--sweep", "-s", help="The sweep to import them into."),
) -> None:  # fmt: skip
    """Import results measured elsewhere as a sweep's trials, so that fit, forecast,
    advise, query and report answer on them (no MLflow run needed). Every row is checked
    first (errors say FILE:LINE); importing again replaces the sweep's imported rows."""
    from scalelab.analysis.results.imports import import_file
    from scalelab.analysis.results.store import ResultsError

    try:
        result = import_file(file, sweep)
    except ResultsError as e:
        raise fail(str(e)) from None
    console.print(str(result), highlight=False, markup=False, soft_wrap=True)
