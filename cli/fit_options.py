"""The options `results fit`, `report`, `plot` and `forecast` share: which trials, the
robust fit's Huber delta, the allocation's budgets, the backtest's holdout by compute or
parameters, IsoFLOP bins (docs/results.md, "Fits", "Forecasts")."""

from __future__ import annotations

import typer

from scalelab.cli.console import fail

WHERE = typer.Option(
    None,
    "--where",
    "-w",
    help='Fit only these trials (results query\'s syntax), e.g. "tokens >= 1e9"',
)
FORECAST_WHERE = typer.Option(
    None,
    "--where",
    "-w",
    help="Forecast from only these trials (results query's syntax), chosen before the "
    'target or hold-out, e.g. "tokens >= 1e9"',
)
BUDGETS = typer.Option(
    None, "--budget", help="Compute budgets (FLOPs) for N*(C), D*(C), e.g. 1e21,1e22 "
    "(default: the largest trial's FLOPs, 10x and 100x)",
)  # fmt: skip
HUBER = typer.Option(
    None,
    "--huber-delta",
    help="Huber delta of the robust L(N, D) fit, on log loss (default 1e-3).",
    show_default=False,
)
HOLDOUT_FLOPS = typer.Option(
    None, "--holdout-above-flops", help="Backtest: hold out the trials above this compute (FLOPs)."
)
HOLDOUT_PARAMS = typer.Option(
    None,
    "--holdout-above-params",
    help="Forecast the trials above this many parameters from the others",
)
ISO_BINS = typer.Option(
    None, "--isoflop-bin-width", help="IsoFLOP fits on the trials' real FLOPs, binned in bins "
    "this many decades wide (e.g. 0.1), instead of nominal budgets",
)  # fmt: skip


def fit_options(
    budget: str | None,
    huber_delta: float | None,
    holdout_flops: float | None,
    bin_width: float | None,
) -> dict:
    """The fit's options from the command line's (exit 2 on a bad one)."""
    from scalelab.analysis.results.allocation import parse_budgets

    try:
        budgets = parse_budgets(budget) if budget is not None else None
    except ValueError as e:
        raise fail(str(e)) from None
    positive(("--huber-delta", huber_delta), ("--holdout-above-flops", holdout_flops),
             ("--isoflop-bin-width", bin_width))  # fmt: skip
    return {"budgets": budgets, "huber_delta": huber_delta, "holdout_flops": holdout_flops,
            "isoflop_bin_width": bin_width}  # fmt: skip


def positive(*options: tuple[str, float | None]) -> None:
    """Exit 2, in one line, on the first (name, value) given that is not a positive number."""
    for name, value in options:
        if value is not None and not 0 < value < float("inf"):
            raise fail(f"{name} {value}: expected a positive number")
