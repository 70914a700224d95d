"""`scalelab results compare SWEEP --metric COLUMN`: any per-trial column, a downstream
accuracy above all, against the baseline per cell and paired over the sweep
(analysis/results/compare.py; docs/evaluation.md, "In the results")."""

from __future__ import annotations

import json
import math
from dataclasses import asdict

import typer

from scalelab.cli.console import stdout_console
from scalelab.cli.results_common import guard, synced

console = stdout_console(160)


def compare_cmd(
    sweep: str = typer.Argument(..., help="Sweep name (the MLflow experiment)."),
    metric: str = typer.Option(
        ..., "--metric", "-m", help="A column of the trials table: eval_piqa_acc, "
        "eval_hellaswag_acc_norm, final_val_loss, ... (`results query --columns` lists them).",
    ),
    baseline: str = typer.Option("dense", "--baseline", "-b", help="Variant the others are compared with."),
    where: str = typer.Option(None, "--where", "-w", help="Only these trials (results query's syntax)."),
    level: float = typer.Option(0.95, "--level", min=0.5, max=0.999, help="Confidence level of the intervals."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of tables."),
    tracking_uri: str = typer.Option(None, "--tracking-uri", help="MLflow tracking URI (default: the work directory's)."),
) -> None:  # fmt: skip
    """Each variant against the baseline on one metric: per cell (size, tokens, ...: means
    over seeds, the paired difference ± its standard error) and over the sweep (the mean
    difference of trials that share a cell and a seed, with a Student-t interval). For
    downstream accuracy, where a scaling-law fit does not apply. Brings the sweep's
    tables up to date first, scores written since included."""
    from scalelab.analysis.results.compare import compare_sweep
    from scalelab.analysis.results.render import comparison_rows, rich_table

    def run():  # noqa: ANN202
        synced(sweep, tracking_uri)
        return compare_sweep(sweep, metric, baseline=baseline, where=where, level=level)

    result = guard(run)
    if as_json:
        print(json.dumps({"metric": result.metric, "baseline": result.baseline,
                          "overall": [asdict(p) for p in result.overall],
                          "cells": [{**asdict(c), "cell": dict(c.cell)} for c in result.cells],
                          "noise": asdict(result.noise) if result.noise else None,
                          "notes": result.notes}, indent=1, default=str))  # fmt: skip
        return
    rows = comparison_rows(result.cells, result.axes, result.baseline, result.metric)
    title = (f"{result.metric} per cell vs {result.baseline} (every swept axis; means over "
             "seeds, Δ ± its standard error over seeds)")  # fmt: skip
    console.print(rich_table(title, rows))
    for p in result.overall:
        interval = (
            f", {p.level:.0%} CI [{p.low:+.4f}, {p.high:+.4f}]" if math.isfinite(p.low) else ""
        )
        console.print(
            f"{p.variant} - {p.baseline}: {p.mean:+.4f} {result.metric} over {p.n_pairs} "
            f"pairs in {p.n_cells} cells{interval}",
            highlight=False,
        )
    if result.noise is not None:
        console.print(noise_line(result.noise), highlight=False)
        if result.noise.warning:
            console.print(f"[red]warning:[/] {result.noise.warning}", highlight=False)
    for note in result.notes:
        console.print(f"[yellow]note:[/] {note}", highlight=False)


def noise_line(noise) -> str:  # noqa: ANN001 (an analysis.results.compare.ItemNoise)
    """'scalelab_zen: 8 items per trial (from the standard error: ± 0.164 a trial), chance
    0.25, mean accuracy 0.281'."""
    items = (
        f"{noise.items} items per trial (from the standard error: ± {noise.trial_se:.3f} a trial)"
        if noise.items is not None
        else "items per trial unknown (no standard error logged)"
    )
    chance = f"chance {noise.chance:g}" if noise.chance is not None else "chance unknown"
    return f"{noise.task}: {items}, {chance}, mean accuracy {noise.mean:.3f}"
