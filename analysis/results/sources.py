"""Reading one sweep's trials: MLflow runs (the truth for membership and status) and each
trial's local files (job.json, curves.jsonl, result.json) when this machine can see them.

MLflow schema (docs/architecture.md, 'Data flow of one sweep'): experiment = sweep name,
parent run `sweep:<name>`, one child run per trial tagged `scalelab.trial_id`,
`scalelab.variant`, `scalelab.size`, ...
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scalelab.contract import workdir
from scalelab.contract.runs import Metric, Role, Tag, search_all, sweep_experiment, sweep_run_name
from scalelab.contract.trial_time import trial_run_rank
from scalelab.jobs.tracking.provenance import unflatten

from .tables import ResultsError

if TYPE_CHECKING:
    import pyarrow as pa
    from mlflow import MlflowClient

# A derived view of val/loss whose `step` is GFLOPs (for the MLflow UI's x-axis): the
# curves table has the flops column instead, so these are left out.
SKIP_SUFFIX = Metric.VAL_LOSS_AT_GFLOP.removeprefix("val/loss")  # "_at_gflop"


@dataclass
class TrialRun:
    run_id: str
    trial_id: str
    status: str
    tags: dict[str, str]
    params: dict[str, str]
    metrics: dict[str, float]  # latest value of each metric
    start_time: int | None
    end_time: int | None


@dataclass
class SweepRuns:
    sweep: str
    uri: str
    experiment_id: str
    parent_run_id: str | None
    trials: list[TrialRun] = field(default_factory=list)


class StoreUnreadable(ResultsError):
    """The tracking store is there but cannot be read now (a server down, a broken file)."""


def _check_store(uri: str) -> None:
    if uri.startswith("sqlite:///"):
        db = Path(uri.removeprefix("sqlite:///"))
        if not db.exists():
            raise ResultsError(f"no MLflow database at {db}: no sweep has run there yet")


def find_sweep_runs(sweep: str, tracking_uri: str | None = None) -> SweepRuns:
    """The sweep's parent run and trial runs (one paged search). Raises ResultsError for an
    unknown sweep, naming the sweeps that exist."""
    import sqlite3

    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException
    from sqlalchemy.exc import SQLAlchemyError

    from scalelab.jobs.tracking.mlflow_store import failure

    uri = tracking_uri or workdir.tracking_uri()
    _check_store(uri)
    try:
        client = MlflowClient(uri)
        exp = client.get_experiment_by_name(sweep)
        if exp is None:
            exp = sweep_experiment(client, sweep)
        if exp is None:
            names = sorted(e.name for e in client.search_experiments() if e.name != "Default")
            known = ", ".join(names[:20]) or "none"
            raise ResultsError(f"unknown sweep {sweep!r}: not in {uri} (sweeps there: {known})")
        runs = search_all(client, [exp.experiment_id])
    except MlflowException as e:
        raise StoreUnreadable(f"cannot read MLflow at {uri}: {e.message}") from None
    except (SQLAlchemyError, sqlite3.Error) as e:  # a database store that is not one
        raise StoreUnreadable(f"cannot read MLflow at {uri}: {failure(e) or e}") from None
    parent = None
    by_trial: dict[str, TrialRun] = {}
    for run in sorted(runs, key=trial_run_rank):
        tags = run.data.tags
        if tags.get(Tag.ROLE) == Role.SWEEP or tags.get(Tag.RUN_NAME) == sweep_run_name(sweep):
            parent = parent or run.info.run_id
            continue
        tid = tags.get(Tag.TRIAL_ID)
        if not tid or tags.get(Tag.SWEEP, sweep) != sweep or tid in by_trial:
            continue  # not a trial of this sweep, or not the trial's run (trial_run_rank)
        by_trial[tid] = TrialRun(
            run_id=run.info.run_id,
            trial_id=tid,
            status=run.info.status,
            tags=dict(tags),
            params=dict(run.data.params),
            metrics=dict(run.data.metrics),
            start_time=run.info.start_time,
            end_time=run.info.end_time,
        )
    return SweepRuns(sweep, uri, exp.experiment_id, parent, list(by_trial.values()))


# ------------------------------------------------------------------ the job's config


def read_job(trial: TrialRun, tdir: Path) -> dict[str, Any]:
    """The trial's JobConfig as a nested dict: job.json if here, else the run's params."""
    path = tdir / workdir.JOB_FILE
    if path.exists():
        try:
            return json.loads(path.read_text())
        except ValueError:
            pass
    return unflatten(trial.params)


def read_result(tdir: Path) -> dict[str, Any] | None:
    path = tdir / workdir.RESULT_FILE
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except ValueError:
        return None  # half-written: treat as absent


# ------------------------------------------------------------------ curves

RAW_FIELDS = ("step", "tokens", "flops", "metric", "value")


def raw_schema() -> pa.Schema:
    import pyarrow as pa

    return pa.schema(
        [
            ("step", pa.int64()),
            ("tokens", pa.int64()),
            ("flops", pa.float64()),
            ("metric", pa.string()),
            ("value", pa.float64()),
        ]
    )


def read_local_curves(path: Path) -> pa.Table:
    """curves.jsonl -> table of (step, tokens, flops, metric, value). A damaged line (a job
    killed mid-write) is skipped rather than failing the sweep."""
    import pyarrow as pa
    import pyarrow.json as pj

    schema = raw_schema()
    try:
        return pj.read_json(
            path,
            read_options=pj.ReadOptions(block_size=1 << 24),
            parse_options=pj.ParseOptions(
                explicit_schema=schema, unexpected_field_behavior="ignore"
            ),
        )
    except (pa.ArrowInvalid, OSError):
        pass
    rows = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            try:
                rec = json.loads(line)
                rows.append(
                    (
                        int(rec["step"]),
                        int(rec["tokens"]),
                        float(rec["flops"]),
                        str(rec["metric"]),
                        float(rec["value"]),
                    )
                )
            except (ValueError, KeyError, TypeError):
                continue
    cols = list(zip(*rows, strict=True)) if rows else [[] for _ in RAW_FIELDS]
    return pa.table([pa.array(c, t.type) for c, t in zip(cols, schema, strict=True)], schema=schema)


def read_mlflow_curves(client: MlflowClient, trial: TrialRun) -> pa.Table:
    """The run's metric histories: one get_metric_history call per metric (batched per
    metric by MLflow, never per point). tokens/flops come from the compute/* histories at
    the same step (interpolated in step when a metric is logged between them)."""
    import numpy as np
    import pyarrow as pa

    keys = sorted(k for k in trial.metrics if not k.endswith(SKIP_SUFFIX))
    hist = {k: client.get_metric_history(trial.run_id, k) for k in keys}

    def series(name: str) -> tuple[np.ndarray, np.ndarray]:
        pts = sorted((m.step, m.value) for m in hist.get(name, []))
        return np.array([p[0] for p in pts], float), np.array([p[1] for p in pts], float)

    def at(name: str, steps: np.ndarray) -> np.ndarray:
        xs, ys = series(name)
        if xs.size == 0:
            return np.zeros(steps.size)
        return np.interp(steps, xs, ys)

    parts = []
    for key, points in hist.items():
        if not points:
            continue
        steps = np.array([m.step for m in points], np.int64)
        values = np.array([m.value for m in points], float)
        parts.append(
            pa.table(
                {
                    "step": steps,
                    "tokens": np.rint(at("compute/tokens", steps.astype(float))).astype(np.int64),
                    "flops": at("compute/flops", steps.astype(float)),
                    "metric": pa.array([key] * steps.size, pa.string()),
                    "value": values,
                },
                schema=raw_schema(),
            )
        )
    if not parts:
        return raw_schema().empty_table()
    return pa.concat_tables(parts)
