"""Shared fixtures for the training-job tests: one real sqlite MLflow store per session
(creating its tables takes several seconds), a tiny job, and an isolated work directory."""

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from scalelab.jobs.config import JobConfig


@pytest.fixture(scope="session")
def mlflow_uri(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("mlflow") / "mlflow.db"
    uri = f"sqlite:///{path}"
    from mlflow.tracking import MlflowClient

    MlflowClient(uri).search_experiments()  # creates the tables once
    return uri


@pytest.fixture
def home(tmp_path, monkeypatch, mlflow_uri) -> Path:
    """A fresh SCALELAB_HOME with the session's MLflow store, one thread, no launcher."""
    monkeypatch.setenv("SCALELAB_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_uri)
    monkeypatch.setenv("SCALELAB_EXPERIMENT", "tests-jobs")
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "SLURM_PROCID"):
        monkeypatch.delenv(key, raising=False)
    return tmp_path / "home"


def _tiny_job(**overrides) -> JobConfig:
    """nano GPT on Python's pydoc text, 8 steps of 8 x 32 tokens."""
    spec = {
        "model": {"size": "nano", "vocab_size": 256, "block_size": 32},
        "data": {"source": "builtin:pydoc", "seq_len": 32, "val_tokens": 256},
        "train": {
            "tokens": 2048,
            "global_batch_tokens": 256,
            "lr": 3e-3,
            "log_interval": 1,
            "eval_interval": 4,
            "checkpoint_interval": 1000,
        },
    }
    for key, value in overrides.items():
        section, _, field = key.partition("__")
        spec.setdefault(section, {})[field] = value
    return JobConfig.model_validate(spec)


def _curve(home: Path, trial_id: str, metric: str) -> list[tuple[int, float]]:
    import json

    path = home / "trials" / trial_id / "curves.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return [(r["step"], r["value"]) for r in rows if r["metric"] == metric]


@pytest.fixture
def tiny_job():
    """tiny_job(section__field=value, ...) -> JobConfig."""
    return _tiny_job


@pytest.fixture
def curve():
    """curve(home, trial_id, metric) -> [(step, value)] from the trial's curves.jsonl."""
    return _curve


os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture
def engine_of():
    """`with engine_of(job) as engine`: see engine_in_process."""
    return engine_in_process


@contextmanager
def engine_in_process(job: JobConfig) -> Iterator:
    """The DeepSpeed engine the training job builds for `job`, on this process as rank 0 of 1."""
    from scalelab.jobs.training import distributed
    from scalelab.jobs.training.ds_config import plan_batch
    from scalelab.jobs.training.train import _Trainer

    env = distributed.read_environment()
    distributed.init(env)
    try:
        trainer = _Trainer(job, env, plan_batch(job, 1), time.time())
        trainer._build_engine()
        yield trainer.engine
    finally:
        distributed.shutdown(env)
