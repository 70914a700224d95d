"""`scalelab results import FILE --sweep NAME`: another ladder's points as a sweep's trials
(analysis/results/imports.py; docs/results.md, "Importing results")."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import typer

from scalelab.cli.console import fail, stdout_console

console = stdout_console(160)


def import_cmd(
    file: Path = typer.Argument(
        ..., help="CSV, Parquet or JSON Lines: one row per trial (N, D or C, loss; optional "
        "variant, seed, size, budget, name).", show_default=False,
    ),
    sweep: str = typer.Option(..., "--sweep", "-s", help="The sweep to import them into."),
    duplicates: Literal["refuse", "merge", "keep"] = typer.Option(  # import_checks.Duplicates
        "refuse", "--duplicates", help="Rows identical in every field read: refuse "
        "lists them and imports nothing; merge imports each once; keep imports every copy as "
        "a trial of its own.", case_sensitive=False,
    ),
) -> None:  # fmt: skip
    """Import results measured elsewhere as a sweep's trials, so that fit, forecast,
    advise, query and report answer on them (no MLflow run needed). Every row is checked
    first (errors say FILE:LINE): UTF-8 text, no repeated rows, flops within 2x of 6·N·D;
    importing again replaces the sweep's imported rows."""
    from scalelab.analysis.results.imports import import_file
    from scalelab.analysis.results.store import ResultsError

    try:
        result = import_file(file, sweep, duplicates=duplicates)
    except ResultsError as e:
        raise fail(str(e)) from None
    console.print(str(result), highlight=False, markup=False, soft_wrap=True)
