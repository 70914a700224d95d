"""Aggregated results of a sweep: MLflow + trial files -> Parquet tables -> queries and fits.

- `sync(sweep)`: build/refresh the `trials` and `curves` tables (incremental)
- `query(sweep, where=..., group_by=..., metric=..., at=...)`: a pyarrow Table
- `load_trials(sweep)`, `load_curves(sweep)`: the synced tables as pyarrow Tables
- `fit_sweep(sweep)`: scaling laws, frontier, gains vs the baseline, per-size comparison
- `summarise_sweep(sweep)`: sync + fit + plots + report, returning the printed summary

Heavy libraries (pyarrow, mlflow, scipy, matplotlib) are imported inside functions.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from .query import metric_at, parse_where, query
from .sync import SyncResult, sync
from .tables import ResultsError, sweep_dir

if TYPE_CHECKING:
    import pyarrow as pa


def load_trials(sweep: str, root: Path | None = None) -> pa.Table:
    from .query import load

    return load(sweep, "trials", root)


def load_curves(sweep: str, root: Path | None = None) -> pa.Table:
    from .query import load

    return load(sweep, "curves", root)


__all__ = [
    "ResultsError",
    "SyncResult",
    "load_curves",
    "load_trials",
    "metric_at",
    "parse_where",
    "query",
    "sweep_dir",
    "sync",
]
