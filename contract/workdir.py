"""The work directory layout (docs/architecture.md, 'Work directory'); one place knows it.

$SCALELAB_HOME (default ./scalelab-runs)
  home.path               where the folder is: opened elsewhere, the store follows
                          (contract/relocation.py)
  mlflow.db               sqlite tracking store (absolute URI)
  artifacts/              MLflow artifacts
  trials/<trial_id>/      job.json, identity.json, ckpt/, curves.jsonl, result.json,
                          outbox/<run_id>/, logs/ (trial.log: every attempt's stdout and
                          stderr, rank 0's; rank<r>.log: rank r's; traceback.txt)
  data/                   token shards, one folder per (source, tokenizer), shared by
                          every trial ($SCALELAB_DATA moves it, e.g. to a cluster filesystem)
  results/<sweep>/        Parquet tables, plots, reports, migrations.jsonl
"""

from __future__ import annotations

import os
from pathlib import Path

from scalelab.contract.relocation import follow_moved_home

JOB_FILE = "job.json"  # the resolved JobConfig
CURVES_FILE = "curves.jsonl"  # one JSON object per point: step, tokens, flops, metric, value
RESULT_FILE = "result.json"  # the job's summary, written last
IDENTITY_FILE = "identity.json"  # the canonical identity tree the trial id hashes
MIGRATIONS_FILE = "migrations.jsonl"  # results/<sweep>/: trial ids re-keyed by migrate
LOGS_DIR = "logs"  # what the trial printed (jobs/tracking/trial_logs.py)
TRIAL_LOG = "trial.log"  # every attempt's stdout and stderr, appended, a header per attempt
# (rank 0's; rank r > 0 of a trial of several ranks appends to logs/rank<r>.log)
TRACEBACK_FILE = "traceback.txt"  # the last failed attempt's Python traceback


def scalelab_home() -> Path:
    return Path(os.environ.get("SCALELAB_HOME", "scalelab-runs")).resolve()


def tracking_uri() -> str:
    """MLFLOW_TRACKING_URI when set, else the sqlite store in the work directory."""
    uri = os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        return uri
    home = scalelab_home()
    home.mkdir(parents=True, exist_ok=True)
    follow_moved_home(home, home / "mlflow.db")  # a copied runs folder writes into itself
    return f"sqlite:///{home / 'mlflow.db'}"  # absolute path: four slashes in all


def artifact_root() -> Path:
    return scalelab_home() / "artifacts"


def trial_dir(trial_id: str) -> Path:
    return scalelab_home() / "trials" / trial_id


def trial_log(trial_id: str, rank: int = 0) -> Path:
    """The trial's log (rank 0's), or rank `rank`'s."""
    name = TRIAL_LOG if rank == 0 else f"rank{rank}.log"
    return trial_dir(trial_id) / LOGS_DIR / name


def data_dir() -> Path:
    """Prepared data: $SCALELAB_DATA when set (a filesystem every node sees), else
    $SCALELAB_HOME/data."""
    override = os.environ.get("SCALELAB_DATA")
    return Path(override).expanduser().resolve() if override else scalelab_home() / "data"


def results_dir() -> Path:
    return scalelab_home() / "results"
