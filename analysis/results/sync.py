"""MLflow + trial directories -> the `trials` and `curves` Parquet tables of one sweep.

Incremental: the sync state remembers each trial's run id and status; a trial synced as
FINISHED (same run) keeps its rows from the previous tables and its files are not read
again. Everything else (new, running, failed, requeued trials) is read afresh, and so is
every trial once the code that derives rows changes (`row_derivation`): an upgrade that
counts parameters or FLOPs differently must not leave old rows next to new ones.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scalelab.analysis.results import tables
from scalelab.contract import workdir
from scalelab.contract.runs import Metric, Tag
from scalelab.contract.trial_time import queued_seconds, run_seconds

from .columns import config_values, summary_column, summary_prefixes, trials_schema, value_at
from .sources import (
    SKIP_SUFFIX,
    TrialRun,
    find_sweep_runs,
    raw_schema,
    read_job,
    read_local_curves,
    read_mlflow_curves,
    read_result,
)

if TYPE_CHECKING:
    import pyarrow as pa

FINISHED = "FINISHED"
EVAL = Metric.EVAL_PREFIX  # downstream scores become columns eval_<task>_<metric>
# The modules whose code turns a trial into its rows (and every registered mechanism's, which
# declares columns and counts); a change to any of them re-reads all.
DERIVING_MODULES = ("scalelab.analysis.results.sync", "scalelab.analysis.results.sources",
                    "scalelab.analysis.results.columns", "scalelab.models.flops", "scalelab.models.config",
                    "scalelab.models.sizes", "scalelab.contract.trial_time")  # fmt: skip


def row_derivation() -> str:
    """A fingerprint of the code that derives rows (the sources of DERIVING_MODULES and of
    the registered mechanisms' modules)."""
    import importlib.util

    from scalelab.models import catalog

    digest = hashlib.sha256()
    for name in (*DERIVING_MODULES, *(type(m).__module__ for m in catalog.mechanisms())):
        spec = importlib.util.find_spec(name)
        digest.update(Path(spec.origin).read_bytes() if spec and spec.origin else name.encode())
    return digest.hexdigest()[:16]


@dataclass(frozen=True)
class SyncResult:
    sweep: str
    trials_path: Path
    curves_path: Path
    state_path: Path
    n_trials: int
    n_read: int  # trials whose files / runs were read this time
    n_reused: int  # FINISHED trials kept from the previous sync
    n_curve_rows: int
    seconds: float

    def __str__(self) -> str:
        return (
            f"synced sweep {self.sweep!r}: {self.n_trials} trials ({self.n_read} read, "
            f"{self.n_reused} unchanged), {self.n_curve_rows:,} curve points in "
            f"{self.seconds:.1f} s -> {self.trials_path.parent.parent}"
        )


def sync(
    sweep: str, tracking_uri: str | None = None, *, root: Path | None = None, workers: int = 4
) -> SyncResult:
    """Build (or update) the sweep's `trials` and `curves` tables. See the module doc."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from scalelab.orchestrator.door import send_owed

    t0 = time.perf_counter()
    runs = find_sweep_runs(sweep, tracking_uri)
    if send_owed(runs.trials, runs.uri)[0]:  # finished trials' spooled points, first
        runs = find_sweep_runs(sweep, tracking_uri)
    derivation = row_derivation()
    with tables.tables_lock(sweep, root):  # from reading the tables to writing them
        state = tables.load_state(sweep, root, derivation)
        old_trials = tables.read_table(tables.TRIALS, sweep, root)
        old_ids = (
            set(old_trials.column("trial_id").to_pylist()) if old_trials is not None else set()
        )

        def unchanged(t: TrialRun) -> bool:
            prev = state.get(t.trial_id, {})
            return (
                prev.get("status") == FINISHED
                and t.status == FINISHED
                and prev.get("run_id") == t.run_id
                and prev.get("eval", {}) == _eval_scores(t)  # `scalelab eval` after it finished
                and prev.get("stage") == t.tags.get(Tag.STAGE)  # a search point the ladder took
                and t.trial_id in old_ids
            )

        keep = [t for t in runs.trials if unchanged(t)]
        fresh = [t for t in runs.trials if not unchanged(t)]
        client = None
        if any(not (workdir.trial_dir(t.trial_id) / workdir.CURVES_FILE).exists() for t in fresh):
            from mlflow import MlflowClient

            client = MlflowClient(runs.uri)
        with ThreadPoolExecutor(max(1, workers)) as pool:  # pyarrow's JSON reader drops the GIL
            read = list(pool.map(lambda t: _read_trial(t, client), fresh))

        rows = [row for row, _ in read]
        curve_parts = [curves for _, curves in read]
        keep_ids = pa.array([t.trial_id for t in keep], pa.string())
        if keep and old_trials is not None:
            rows += old_trials.filter(pc.is_in(old_trials["trial_id"], keep_ids)).to_pylist()
            old_curves = tables.read_table(tables.CURVES, sweep, root)
            if old_curves is not None:
                old_curves = old_curves.filter(
                    pc.is_in(old_curves["trial_id"].cast(pa.string()), keep_ids)
                )
                curve_parts.append(_strings(old_curves))
        if old_trials is not None:  # rows `results import` wrote: no run stands behind them
            from .imports import IMPORTED

            rows += old_trials.filter(pc.equal(old_trials["curves_source"], IMPORTED)).to_pylist()
        extra = sorted(
            {
                k
                for r in rows
                for k in r
                if k.startswith(tuple(summary_column(p) for p in (*summary_prefixes(), EVAL)))
            }
            - {f.name for f in trials_schema([])}
        )
        schema = trials_schema(extra)
        rows.sort(key=lambda r: (r["variant"] or "", r["n_params"] or 0, r["trial_id"]))
        trials = pa.Table.from_pylist([{k: r.get(k) for k in schema.names} for r in rows], schema)
        curves = tidy_curves(curve_parts)
        trials_path = tables.write_table(tables.TRIALS, sweep, trials, root)
        curves_path = tables.write_table(tables.CURVES, sweep, curves, root)
        state_path = tables.save_state(
            sweep,
            {
                t.trial_id: {"run_id": t.run_id, "status": t.status, "eval": _eval_scores(t),
                             "stage": t.tags.get(Tag.STAGE)}
                for t in runs.trials
            },
            root,
            derivation,
        )  # fmt: skip
    return SyncResult(
        sweep=sweep,
        trials_path=trials_path,
        curves_path=curves_path,
        state_path=state_path,
        n_trials=trials.num_rows,
        n_read=len(fresh),
        n_reused=len(keep),
        n_curve_rows=curves.num_rows,
        seconds=time.perf_counter() - t0,
    )


def _strings(table: pa.Table) -> pa.Table:
    """Dictionary columns back to plain strings (for concatenation with fresh parts)."""
    import pyarrow as pa

    for name in ("trial_id", "metric"):
        i = table.schema.get_field_index(name)
        table = table.set_column(i, name, table[name].cast(pa.string()))
    return table


def tidy_curves(parts: list[pa.Table]) -> pa.Table:
    """Concatenate, drop points logged twice (a resumed job re-logs steps after its last
    checkpoint: the later point wins), sort by (trial_id, metric, step), dictionary-encode."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    schema = tables.curves_schema()
    parts = [p for p in parts if p.num_rows]
    if not parts:
        return schema.empty_table()
    table = pa.concat_tables([p.select(schema.names) for p in parts])
    table = table.append_column("_row", pa.array(np.arange(table.num_rows)))
    order = pc.sort_indices(
        table,
        sort_keys=[
            ("trial_id", "ascending"),
            ("metric", "ascending"),
            ("step", "ascending"),
            ("_row", "ascending"),
        ],
    )
    table = table.take(order).drop_columns(["_row"])
    tid = table["trial_id"].combine_chunks().dictionary_encode()
    met = table["metric"].combine_chunks().dictionary_encode()
    step = table["step"].to_numpy()
    same_as_next = np.zeros(table.num_rows, bool)
    same_as_next[:-1] = (
        (tid.indices.to_numpy()[:-1] == tid.indices.to_numpy()[1:])
        & (met.indices.to_numpy()[:-1] == met.indices.to_numpy()[1:])
        & (step[:-1] == step[1:])
    )
    table = table.set_column(0, "trial_id", tid).set_column(
        table.schema.get_field_index("metric"), "metric", met
    )
    if same_as_next.any():
        table = table.filter(pa.array(~same_as_next))
    return table.cast(schema)


def _read_trial(t: TrialRun, client: Any) -> tuple[dict[str, Any], pa.Table]:
    """One trial's row and its curve points, from its directory or else from MLflow."""
    import pyarrow as pa
    import pyarrow.compute as pc

    tdir = workdir.trial_dir(t.trial_id)
    job = read_job(t, tdir)
    result = read_result(tdir) or {}
    curves_file = tdir / workdir.CURVES_FILE
    if curves_file.exists():
        raw, source = read_local_curves(curves_file), "local"
    elif client is not None:
        raw, source = read_mlflow_curves(client, t), "mlflow"
    else:
        raw, source = None, "none"
    if raw is not None:
        raw = raw.filter(pc.invert(pc.ends_with(raw["metric"], SKIP_SUFFIX)))
    last = _last_values(raw)
    val = _series(raw, "val/loss")
    row: dict[str, Any] = {
        "trial_id": t.trial_id,
        "name": t.tags.get(Tag.RUN_NAME) or t.trial_id,
        "run_id": t.run_id,
        "variant": t.tags.get("scalelab.variant"),
        "size": t.tags.get("scalelab.size") or value_at(job, ("model", "size")),
        "status": t.status,
        "reason": result.get("reason") or t.tags.get("scalelab.error"),
        "backend": t.tags.get("scalelab.backend"),
        "code_version": t.tags.get("scalelab.code_version"),
        "curves_source": source,
        "branched_from": t.tags.get(Tag.BRANCHED_FROM),
        "stage": t.tags.get(Tag.STAGE),
        "steps": _first(result.get("steps"), _max(raw, "step")),
        "tokens": _first(
            result.get("tokens"),
            last.get("compute/tokens"),
            _max(raw, "tokens"),
            _num(t.params.get("tokens")),
            _num(t.tags.get("scalelab.tokens")),
        ),
        "flops": _first(result.get("flops"), last.get("compute/flops"), _max(raw, "flops")),
        "final_val_loss": _first(result.get("final_val_loss"), val[-1] if val else None, ...),
        "best_val_loss": _first(
            result.get("best_val_loss"),
            min((v for v in val if math.isfinite(v)), default=None),
            ...,
        ),
        "n_params": _first(result.get("n_params"), _num(t.params.get("n_params"))),
        "n_nonembed": result.get("n_nonembed"),
        # the run time every view shows (contract/trial_time.py); the job's own clock
        # (result.json) only where MLflow lacks it
        "wall_time_s": _first(
            run_seconds(t.tags, t.status, t.end_time), result.get("wall_time_s"), _wall(t)
        ),
        "queued_s": queued_seconds(t.tags),
        "config": json.dumps(job, sort_keys=True),
    }
    row.update(config_values(job, last))
    row.update({summary_column(k): v for k, v in _eval_scores(t).items()})
    if row["n_params"] is None or row["n_nonembed"] is None:
        row.update(_count_params(job, row))
    if raw is None:
        raw = raw_schema().empty_table()
    trial_col = pa.array([t.trial_id] * raw.num_rows, pa.string())
    return row, raw.append_column("trial_id", trial_col)


def _eval_scores(t: TrialRun) -> dict[str, float]:
    """The downstream scores on the trial's run (`scalelab eval`: eval/<task>/<metric>)."""
    return {k: v for k, v in sorted(t.metrics.items()) if k.startswith(EVAL)}


def _first(*values: Any) -> Any:
    """The first value that is not None; `...` ends the list early (keeps NaN losses:
    a diverged run's NaN is an answer, not a missing value)."""
    for v in values:
        if v is ...:
            return None
        if v is not None:
            return v
    return None


def _num(text: str | None) -> float | None:
    try:
        return None if text is None else float(text)
    except ValueError:
        return None


def _max(raw: pa.Table | None, column: str) -> Any:
    import pyarrow.compute as pc

    if raw is None or raw.num_rows == 0:
        return None
    return pc.max(raw[column]).as_py()


def _series(raw: pa.Table | None, metric: str) -> list[float]:
    """Values of `metric` in step order (the later point wins for a repeated step)."""
    import pyarrow.compute as pc

    if raw is None or raw.num_rows == 0:
        return []
    sel = raw.filter(pc.equal(raw["metric"], metric))
    by_step = dict(zip(sel["step"].to_pylist(), sel["value"].to_pylist(), strict=True))
    return [by_step[s] for s in sorted(by_step)]


def _last_values(raw: pa.Table | None) -> dict[str, float]:
    """Each metric's value at its largest step."""
    if raw is None or raw.num_rows == 0:
        return {}
    out: dict[str, tuple[int, float]] = {}
    for step, metric, value in zip(
        raw["step"].to_pylist(), raw["metric"].to_pylist(), raw["value"].to_pylist(), strict=True
    ):
        if metric not in out or step >= out[metric][0]:
            out[metric] = (step, value)
    return {k: v for k, (_, v) in out.items()}


def _wall(t: TrialRun) -> float | None:
    if t.start_time and t.end_time:
        return (t.end_time - t.start_time) / 1000.0
    return None


def _count_params(job: dict[str, Any], row: dict[str, Any]) -> dict[str, Any]:
    """Exact counts from the model config when the job did not report them."""
    from scalelab.models.config import ModelConfig
    from scalelab.models.flops import count_params

    try:
        cfg = ModelConfig(**job["model"])
    except Exception:  # an unreadable or older config: leave the counts empty
        return {}
    return {
        "n_params": row["n_params"] if row["n_params"] is not None else count_params(cfg),
        "n_nonembed": row["n_nonembed"]
        if row["n_nonembed"] is not None
        else count_params(cfg, non_embedding=True),
    }
