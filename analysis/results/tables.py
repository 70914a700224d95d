"""Where the results tables live and how they are written and read (pyarrow, Parquet).

results/                         (jobs.workdir.results_dir())
  trials/sweep=<name>/part-0.parquet   one row per trial
  curves/sweep=<name>/part-0.parquet   one row per (trial, metric, step)
  <name>/sync_state.json               which trials are synced, at what status
  <name>/plots/*.png, <name>/report.md
  .locks/<name>.lock                   held by whoever rewrites the sweep's tables

Both tables are hive-partitioned by `sweep` and compressed with zstd; a sync or an import
rewrites only its own sweep's partition. Each partition is one file, written whole under a
hidden name and renamed into place: a reader sees the old table or the new one. Whoever
rewrites a sweep's tables (`results sync`, `results import`, `scalelab eval`'s re-sync)
holds the sweep's lock (`tables_lock`) from reading them to writing them, so that neither
writes back rows the other has just replaced (docs/architecture.md, "Data flow of one
sweep", step 6).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scalelab.contract import workdir
from scalelab.contract.runs import sweep_name_problem

if TYPE_CHECKING:
    import pyarrow as pa

TRIALS, CURVES = "trials", "curves"
PART_FILE = "part-0.parquet"  # a partition's one file
STATE_FILE = "sync_state.json"
# Row groups of 1M rows: pyarrow's dataset writer cut 10M rows into ~7k tiny groups.
ROWS_PER_GROUP = 1 << 20
LOCKS = ".locks"  # hidden: pyarrow's dataset discovery skips it
LOCK_WAIT_S = 600.0  # how long a writer waits for another writer of the same sweep


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
    """Replace the sweep's partition of `kind` with `table` (which has no sweep column): one
    file written under a hidden name beside it and renamed over it (atomic for a reader),
    then any other file of the partition removed. Call it under `tables_lock`."""
    import pyarrow.parquet as pq

    part = partition_dir(kind, sweep, root)
    part.mkdir(parents=True, exist_ok=True)
    target = part / PART_FILE
    tmp = part / f".{PART_FILE}.{os.getpid()}.tmp"  # hidden: no reader lists it
    try:
        pq.write_table(table, tmp, compression="zstd", row_group_size=ROWS_PER_GROUP)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    for old in part.glob("*.parquet"):
        if old.name != PART_FILE:
            old.unlink(missing_ok=True)
    return part


@contextmanager
def tables_lock(
    sweep: str, root: Path | None = None, wait_s: float | None = None
) -> Iterator[None]:
    """Hold the sweep's lock for a read-modify-write of its tables (module doc). Another
    process holding it is waited for, `wait_s` seconds at most (LOCK_WAIT_S), with one line
    on stderr saying so; past that, ResultsError in one line. A process that dies lets go
    of it (an OS lock on the file, not the file's existence)."""
    from filelock import FileLock, Timeout

    wait_s = LOCK_WAIT_S if wait_s is None else wait_s
    locks = results_root(root) / LOCKS
    locks.mkdir(parents=True, exist_ok=True)
    path = locks / f"{_named(sweep)}.lock"
    lock = FileLock(str(path))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        print(
            f"waiting for another process writing the results tables of sweep {sweep!r} "
            f"(at most {wait_s:g} s) ...", file=sys.stderr, flush=True,
        )  # fmt: skip
        try:
            lock.acquire(timeout=wait_s)
        except Timeout:
            raise ResultsError(
                f"sweep {sweep!r}: another process (a results sync or import) has been "
                f"writing its results tables for more than {wait_s:g} s ({path}); nothing "
                "written: run this again once it has finished"
            ) from None
    try:
        yield
    finally:
        lock.release()


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
