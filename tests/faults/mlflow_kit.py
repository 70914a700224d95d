"""What the outbox and ledger fault tests share: a real `mlflow server` that can be stopped
and started again on the same port, a tiny real training job, a fresh work directory, and
readers for what MLflow and curves.jsonl hold."""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from pathlib import Path

from scalelab.jobs.config import JobConfig

ROOT = Path(__file__).resolve().parents[2]


# MLflow's job runner (GenAI jobs: huey consumer processes) serves no tracking need and
# costs every start seconds of CPU; `scalelab ui` turns it off the same way.
NO_JOB_RUNNER = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}


class MlflowServer:
    """`mlflow server` on 127.0.0.1 over a sqlite store; stop() and start() keep the port.
    `scalelab_ui=True` starts the real `scalelab ui` on that store instead."""

    def __init__(self, store_uri: str, scalelab_ui: bool = False) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.uri = f"http://127.0.0.1:{self.port}"
        self.store_uri = store_uri
        self.scalelab_ui = scalelab_ui
        self.proc: subprocess.Popen | None = None

    def _command(self) -> list[str]:
        if self.scalelab_ui:
            return [sys.executable, "-m", "scalelab.cli.main", "ui", "--port", str(self.port)]
        return [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1",
                "--port", str(self.port), "--workers", "1", "--backend-store-uri", self.store_uri]  # fmt: skip

    def login(self) -> tuple[str, str]:
        """`scalelab ui`'s login (user, password), read from the work directory as its owner
        reads it (docs/monitoring.md)."""
        from scalelab.cli.ui_server import LOGIN_USER
        from scalelab.contract.workdir import scalelab_home

        assert self.scalelab_ui, "`mlflow server` has no login"
        return LOGIN_USER, (scalelab_home() / "ui" / "password").read_text().strip()

    def headers(self) -> dict[str, str]:
        """What a request to the server carries: the login for `scalelab ui`, else nothing."""
        if not self.scalelab_ui:
            return {}
        login = base64.b64encode(":".join(self.login()).encode()).decode()
        return {"Authorization": f"Basic {login}"}

    def _store_env(self) -> dict[str, str]:
        return {"MLFLOW_TRACKING_URI": self.store_uri} if self.scalelab_ui else {}

    def start(self) -> MlflowServer:
        self.proc = subprocess.Popen(
            self._command(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True,
            env=os.environ | NO_JOB_RUNNER | self._store_env(),
        )  # fmt: skip
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                urllib.request.urlopen(f"{self.uri}/health", timeout=1)
                return self
            except OSError:
                time.sleep(0.3)
        self.stop()
        raise RuntimeError("mlflow server did not start")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)  # the server and its uvicorn worker
            self.proc.wait(timeout=30)
        self.proc = None


def tiny_job(**overrides: object) -> JobConfig:
    """nano GPT on Python's pydoc text, 12 steps of 8 x 32 tokens, a point every step."""
    spec: dict = {
        "model": {"size": "nano", "vocab_size": 256, "block_size": 32},
        "data": {"source": "builtin:pydoc", "seq_len": 32, "val_tokens": 256},
        "train": {"tokens": 256 * 12, "global_batch_tokens": 256, "lr": 3e-3,
                  "log_interval": 1, "eval_interval": 4, "checkpoint_interval": 1000},
    }  # fmt: skip
    for key, value in overrides.items():
        section, _, name = key.partition("__")
        spec.setdefault(section, {})[name] = value
    return JobConfig.model_validate(spec)


def env(home: Path, uri: str | None = None) -> dict[str, str]:
    """The environment of a scalelab process working in `home` (tracking: `uri`, else the
    home's sqlite store)."""
    out = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    path = os.pathsep.join([str(ROOT), str(ROOT / "tests")])  # jobs, and faults.* for Ray
    out |= {"SCALELAB_HOME": str(home), "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}
    return out | ({"MLFLOW_TRACKING_URI": uri} if uri else {})


def scalelab(*args: str, home: Path, uri: str | None = None, timeout: float = 300):
    """Run the real CLI; returns the CompletedProcess (text)."""
    return subprocess.run(
        [sys.executable, "-m", "scalelab.cli.main", *args],
        env=env(home, uri), capture_output=True, text=True, timeout=timeout, cwd=ROOT,
    )  # fmt: skip


def curve_points(home: Path, trial_id: str) -> list[dict]:
    path = home / "trials" / trial_id / "curves.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def mlflow_points(uri: str, run_id: str) -> dict[str, list[tuple[int, float]]]:
    """Every metric point of a run: metric -> [(step, value)] sorted by step (repeats kept)."""
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    keys = client.get_run(run_id).data.metrics
    return {
        k: sorted((m.step, m.value) for m in client.get_metric_history(run_id, k)) for k in keys
    }


def repeated(pairs: list[tuple[int, float]] | list[int]) -> list:
    """Steps (or keys) that occur more than once."""
    steps = [p[0] if isinstance(p, tuple) else p for p in pairs]
    return sorted(s for s, n in Counter(steps).items() if n > 1)


def finished_job(job: JobConfig, run_id: str | None = None) -> dict:
    """A job that trains nothing (`--job faults.mlflow_kit:finished_job`): for tests of
    the driver's side."""
    return {"status": "FINISHED"}


def sweep_yaml(name: str, seeds: int = 2, steps: int = 12, **backend: object) -> str:
    """A tiny sweep of nano models (`steps` steps of 256 tokens), one trial per seed."""
    cfg = {"concurrency": 1, "max_retries": 0, "cpus_per_trial": 1} | backend
    return f"""
name: {name}
base:
  model: {{size: nano, vocab_size: 256, block_size: 32}}
  data: {{source: "builtin:pydoc", tokenizer: byte, seq_len: 32, val_tokens: 256}}
  train: {{tokens: {256 * steps}, global_batch_tokens: 256, log_interval: 1, eval_interval: 4}}
grid:
  seed: {list(range(seeds))}
backend: {json.dumps(cfg)}
"""
