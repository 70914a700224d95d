"""Where the results tables live and how they are written and read (pyarrow, Parquet).

results/                         (jobs.workdir.results_dir())
  trials/sweep=<name>/part-0.parquet   one row per trial
  curves/sweep=<name>/part-0.parquet   one row per (trial, metric, step)
  <name>/sync_state.json               which trials are synced, at what status
  <name>/plots/*.png, <name>/report.md

Both tables are hive-partitioned by `sweep` and compressed with zstd; a sync rewrites only
its own sweep's partition (`existing_data_behavior="delete_matching"`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scalelab.contract import workdir
from scalelab.contract.runs import sweep_name_problem

if TYPE_CHECKING:
    import pyarrow as pa

TRIALS, CURVES = "trials", "curves"
STATE_FILE = "sync_state.json"
# Row groups of 1M rows: pyarrow's defaults cut 10M rows into ~7k tiny groups.
MIN_ROWS_PER_GROUP = 1 << 20
MAX_ROWS_PER_GROUP = 1 << 20


class ResultsError(ValueError):
    """The results cannot answer the request; the message says what is missing."""


def results_root(root: Path | None = None) -> Path:
    return Path(root) if root is not None else workdir.results_dir()


def sweep_dir(sweep: str, root: Path | None = None) -> Path:
    return results_root(root) / _named(sweep)


def _named(sweep: str) -> str:
    """The sweep's name, which is part of a path here: ResultsError for one no sweep has."""
    problem = sweep_name_problem(sweep)
    if problem:
        raise ResultsError(problem)
    return sweep


def table_dir(kind: str, root: Path | None = None) -> Path:
    return results_root(root) / kind


def curves_schema() -> pa.Schema:
    import pyarrow as pa

    return pa.schema(
        [
            ("trial_id", pa.dictionary(pa.int32(), pa.string())),
            ("step", pa.int64()),
            ("tokens", pa.int64()),
            ("flops", pa.float64()),
            ("metric", pa.dictionary(pa.int32(), pa.string())),
            ("value", pa.float64()),
        ]
    )


def write_table(kind: str, sweep: str, table: pa.Table, root: Path | None = None) -> Path:
    """Replace the sweep's partition of `kind` with `table` (which has no sweep column)."""
    import pyarrow as pa
    import pyarrow.dataset as ds

    table = table.append_column("sweep", pa.array([sweep] * table.num_rows, pa.string()))
    base = table_dir(kind, root)
    ds.write_dataset(
        table,
        base,
        format="parquet",
        partitioning=ds.partitioning(pa.schema([("sweep", pa.string())]), flavor="hive"),
        existing_data_behavior="delete_matching",
        basename_template="part-{i}.parquet",
        file_options=ds.ParquetFileFormat().make_write_options(compression="zstd"),
        min_rows_per_group=min(MIN_ROWS_PER_GROUP, max(table.num_rows, 1)),
        max_rows_per_group=MAX_ROWS_PER_GROUP,
    )
    if table.num_rows == 0:  # write_dataset writes no file for an empty table
        part = partition_dir(kind, sweep, root)
        part.mkdir(parents=True, exist_ok=True)
        for old in part.glob("*.parquet"):
            old.unlink()
        import pyarrow.parquet as pq

        pq.write_table(table.drop_columns(["sweep"]), part / "part-0.parquet", compression="zstd")
    return partition_dir(kind, sweep, root)


def partition_dir(kind: str, sweep: str, root: Path | None = None) -> Path:
    from urllib.parse import quote

    return table_dir(kind, root) / f"sweep={quote(_named(sweep), safe='')}"


def read_table(
    kind: str, sweep: str, root: Path | None = None, columns: list[str] | None = None
) -> pa.Table | None:
    """The sweep's rows of `kind` (without the sweep column), or None if never synced."""
    import pyarrow.parquet as pq

    part = partition_dir(kind, sweep, root)
    files = sorted(part.glob("*.parquet"))
    if not files:
        return None
    read_dictionary = ["trial_id", "metric"] if kind == CURVES else None
    tables = [pq.read_table(f, columns=columns, read_dictionary=read_dictionary) for f in files]
    if len(tables) == 1:
        return tables[0]
    import pyarrow as pa

    return pa.concat_tables(tables, promote_options="permissive").unify_dictionaries()


def load_state(
    sweep: str, root: Path | None = None, derivation: str = ""
) -> dict[str, dict[str, Any]]:
    """{trial_id: {"run_id", "status"}} of the last sync ({} when never synced, or when the
    rows were derived by other code than `derivation` names: they are all read again)."""
    path = sweep_dir(sweep, root) / STATE_FILE
    if not path.exists():
        return {}
    try:
        state = json.loads(path.read_text())
        return state["trials"] if state.get("derivation", "") == derivation else {}
    except (ValueError, KeyError):
        return {}  # a damaged state only costs a full re-read


def save_state(
    sweep: str, trials: dict[str, dict[str, Any]], root: Path | None = None, derivation: str = ""
) -> Path:
    path = sweep_dir(sweep, root) / STATE_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    state = {"version": 1, "derivation": derivation, "trials": trials}
    tmp.write_text(json.dumps(state, indent=1, sort_keys=True))
    tmp.replace(path)
    return path
