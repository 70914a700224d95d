"""The one door into a sweep's results (docs/architecture.md, 'The doors'): `scalelab
results ...`, the end-of-sweep summary and report, and the notebook API bring the sweep's
tables up to date by one rule, here, then answer from them.

    up_to_date(sweep)      -> Freshness     the rule below; what it did, in one line
                                            (`tell` passes its news to the caller's `said`)
    trials(sweep)          -> pa.Table      the trials (or curves) table
    fit(sweep, ...)        -> SweepFit      scaling laws, gains, forecasts' backtest
    forecast(sweep, ...)   -> Forecast      a larger run's loss with a prediction interval

The rule: a sweep that MLflow records is synced before every answer (incrementally: a
sweep with nothing new costs one search; a finished trial's spooled points are sent first),
unless the caller asks not to (`sync=False`) or the sweep's trials were imported (no MLflow
run stands behind them). A sweep synced before whose tracking store cannot be read now (a
server down, a broken file) is answered from its tables as last synced, and the answer says
so; one whose store does not hold it (tables copied elsewhere) from its tables alone; a
sweep never synced needs its store. So `scalelab results fit S` and `scalelab.fit("S")` fit the same table.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scalelab.analysis.results.sources import StoreUnreadable
from scalelab.analysis.results.tables import TRIALS, ResultsError, read_table

if TYPE_CHECKING:
    import pyarrow as pa

    from scalelab.analysis.results.fit import SweepFit
    from scalelab.analysis.results.loss_forecast import Forecast
    from scalelab.analysis.results.sync import SyncResult


class StaleResults(UserWarning):
    """The answer comes from tables synced earlier: the tracking store could not be read."""


@dataclass(frozen=True)
class Freshness:
    """What `up_to_date` did: `synced`, this call's sync; else `note`, why it did not."""

    sweep: str
    synced: SyncResult | None = None
    note: str | None = None
    stale: bool = False  # the tracking store failed: the tables are as last synced

    @property
    def line(self) -> str:
        """One line for a log or a summary."""
        return str(self.synced) if self.synced is not None else str(self.note)

    @property
    def news(self) -> str | None:
        """The line worth telling a user who asked a question: a sync that read new trials
        (the first one always does), or why the tables may be old; None otherwise."""
        if self.synced is not None:
            return str(self.synced) if self.synced.n_read else None
        return self.note if self.stale else None


def up_to_date(
    sweep: str, tracking_uri: str | None = None, *, sync: bool = True, root: Path | None = None
) -> Freshness:
    """Bring the sweep's tables up to date by the module's rule."""
    from scalelab.analysis.results.imports import imported_only
    from scalelab.analysis.results.sync import sync as sync_tables

    if not sync:
        return Freshness(sweep, note=f"sweep {sweep!r}: tables as last synced (sync not asked)")
    if imported_only(sweep, root):
        return Freshness(sweep, note=f"sweep {sweep!r}: imported trials (no MLflow run to sync)")
    try:
        return Freshness(sweep, synced=sync_tables(sweep, tracking_uri, root=root))
    except ResultsError as e:
        if read_table(TRIALS, sweep, root, columns=["trial_id"]) is None:
            raise  # never synced: nothing to answer from
        if isinstance(e, StoreUnreadable):
            return Freshness(sweep, note=f"not synced, tables as last synced: {e}", stale=True)
        # the store holds no such sweep: its tables are all there is (copied, or written)
        return Freshness(sweep, note=f"sweep {sweep!r}: its tables only ({e})")


Said = Callable[[str], None]  # hears the line worth telling (Freshness.news)


def trials(
    sweep: str,
    *,
    curves: bool = False,
    sync: bool = True,
    tracking_uri: str | None = None,
    root: Path | None = None,
    said: Said | None = None,
) -> pa.Table:
    """The sweep's trials table (one row per trial), or with `curves` its curves table."""
    from scalelab.analysis.results import load_curves, load_trials

    tell(up_to_date(sweep, tracking_uri, sync=sync, root=root), said)
    return load_curves(sweep, root) if curves else load_trials(sweep, root)


def fit(
    sweep: str,
    *,
    where: str | None = None,
    sync: bool = True,
    tracking_uri: str | None = None,
    root: Path | None = None,
    said: Said | None = None,
    **options: Any,
) -> SweepFit:
    """`fit_sweep` (analysis/results/fit.py) on the trials `where` keeps, after the rule."""
    from scalelab.analysis.results.fit import fit_sweep

    tell(up_to_date(sweep, tracking_uri, sync=sync, root=root), said)
    return fit_sweep(sweep, root=root, where=where, **options)


def forecast(
    sweep: str,
    *,
    loss: str = "final_val_loss",
    sync: bool = True,
    tracking_uri: str | None = None,
    root: Path | None = None,
    said: Said | None = None,
    **options: Any,
) -> Forecast:
    """`forecast_table` (analysis/results/loss_forecast.py) on the sweep's trials, after the
    rule; `options` are its target (size, flops, holdout, holdout_flops, ...) and law."""
    from scalelab.analysis.results import load_trials
    from scalelab.analysis.results.loss_forecast import forecast_table

    tell(up_to_date(sweep, tracking_uri, sync=sync, root=root), said)
    table = load_trials(sweep, root)
    if loss not in table.column_names:
        raise ResultsError(f"unknown loss column {loss!r} (use final_val_loss or best_val_loss)")
    return forecast_table(table, sweep, loss=loss, **options)


def tell(freshness: Freshness, said: Said | None) -> None:
    """Its news to `said` (the CLI prints it); without one, stale tables as a warning."""
    if said is not None and freshness.news:
        said(freshness.news)
    elif said is None and freshness.stale:
        warnings.warn(freshness.line, StaleResults, stacklevel=3)
