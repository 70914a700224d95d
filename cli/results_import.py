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
    max_rows: int = typer.Option(
        2_000_000, "--max-rows", min=1, help="Refuse a file of more rows than this (counted "
        "before it is parsed).",
    ),
    join_trained: bool = typer.Option(
        False, "--join-trained", help="Import into a sweep that has trained (synced) trials: "
        "the imported rows then join their fits, plots and comparisons. Without it such an "
        "import is refused.",
    ),
) -> None:  # fmt: skip
    """Import results measured elsewhere as a sweep's trials, so that fit, forecast,
    advise, query and report answer on them (no MLflow run needed). Every row is checked
    first (errors say FILE:LINE): UTF-8 text, no repeated rows, flops within 2x of 6·N·D;
    importing again replaces the sweep's imported rows. Control characters in what it
    prints and stores are written as their escapes (\\x1b)."""
    from scalelab.analysis.results.import_checks import visible
    from scalelab.analysis.results.import_read import ImportLimits
    from scalelab.analysis.results.imports import import_file
    from scalelab.analysis.results.tables import ResultsError

    try:
        result = import_file(file, sweep, duplicates=duplicates, join_trained=join_trained,
                             limits=ImportLimits(max_rows=max_rows))  # fmt: skip
    except ResultsError as e:
        raise fail(visible(str(e), keep="\n")) from None
    console.print(str(result), highlight=False, markup=False, soft_wrap=True)
