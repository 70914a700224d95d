"""MLflow tracking that never blocks training and never loses a point.

Only rank 0 tracks. Every point (and every tag, param and status change) is first appended
to an outbox file in the trial directory (`outbox.jsonl`), and every metric also to the
trial's curve file (`curves.jsonl`) that the results layer reads. A background thread sends
the outbox with `log_batch` (up to 1000 metrics per call) and records how far it got in
`outbox.offset`. When MLflow is unreachable the thread just retries later: the outbox is the
spool, so nothing is lost across outages, crashes or requeues, and a resumed job (or
`deliver_outbox`) sends what is left.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from jobs.paths import CURVES_FILE

OUTBOX_FILE = "outbox.jsonl"
OFFSET_FILE = "outbox.offset"
LOCK_FILE = "outbox.lock"
ERROR_FILE = "outbox.error"
REJECTED_FILE = "outbox.rejected.jsonl"
MAX_METRICS, MAX_PARAMS, MAX_TAGS = 1000, 100, 100  # log_batch limits per call
# MLflow error codes meaning "the store answered and refused this batch" (retrying cannot
# help); anything else (connection refused, timeouts, 5xx) means "try again later".
REJECTED_CODES = {"INVALID_PARAMETER_VALUE", "BAD_REQUEST", "RESOURCE_DOES_NOT_EXIST"}
# '@' is not allowed in MLflow metric names, so DESIGN.md's val/loss@gflop is logged as:
VAL_LOSS_AT_GFLOP = "val/loss_at_gflop"
METRIC_NAME = re.compile(r"^[\w\-. :/]+$")  # what MLflow accepts


class Tracker:
    """Rank 0's link to one MLflow run. On other ranks every method is a no-op."""

    def __init__(self, trial_dir: Path, enabled: bool, flush_interval_s: float = 1.0) -> None:
        self.dir, self.enabled, self.interval = Path(trial_dir), enabled, flush_interval_s
        self.run_id: str | None = None
        self._sender: subprocess.Popen | None = None
        self._outbox = self._curves = None

    # -- set-up -----------------------------------------------------------------------
    def start(
        self,
        run_id: str | None,
        experiment: str,
        run_name: str,
        tags: dict[str, str],
        params: dict[str, str],
    ) -> str | None:
        """Attach to `run_id` (or create a run), mark it RUNNING and start sending."""
        if not self.enabled:
            return run_id
        # Fail fast inside one send instead of retrying for minutes: the outbox retries.
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
        self.dir.mkdir(parents=True, exist_ok=True)
        fresh_run = run_id is None
        if fresh_run:
            run_id = self._create_run(experiment, run_name)
        self.run_id = run_id
        self._outbox = open(self.dir / OUTBOX_FILE, "a", encoding="utf-8")
        self._curves = open(self.dir / CURVES_FILE, "a", encoding="utf-8")
        self._put({"kind": "status", "status": "RUNNING"})
        for key, value in tags.items():
            self._put({"kind": "tag", "key": key, "value": str(value)})
        if fresh_run or not (self.dir / OFFSET_FILE).exists():
            for key, value in params.items():
                self._put({"kind": "param", "key": key, "value": value})
        self._sender = subprocess.Popen(
            [sys.executable, "-m", "jobs.tracking", str(self.dir), run_id, str(self.interval)],
            stdin=subprocess.PIPE,  # closing it means "send what is left, then exit"
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
        return run_id

    def _create_run(self, experiment: str, run_name: str) -> str:
        from mlflow.tracking import MlflowClient

        from jobs.paths import artifact_root, tracking_uri

        try:
            client = MlflowClient(tracking_uri())
            exp = client.get_experiment_by_name(experiment)
            exp_id = (
                exp.experiment_id
                if exp
                else client.create_experiment(
                    experiment, artifact_location=artifact_root().as_uri()
                )
            )
            return client.create_run(exp_id, run_name=run_name).info.run_id
        except Exception as e:
            raise RuntimeError(f"could not create an MLflow run at {tracking_uri()}: {e}") from None

    # -- recording (main thread) ------------------------------------------------------
    def _put(self, item: dict[str, Any]) -> None:
        self._outbox.write(json.dumps(item) + "\n")
        self._outbox.flush()

    def log(self, step: int, tokens: int, flops: float, metrics: dict[str, float]) -> None:
        """Record metrics at optimizer step `step` (curves.jsonl + the outbox)."""
        if not self.enabled:
            return
        now = int(time.time() * 1000)
        lines, items = [], []
        for name, value in metrics.items():
            if not METRIC_NAME.match(name):
                raise ValueError(f"{name!r} is not a valid MLflow metric name")
            value = float(value)
            lines.append(
                json.dumps(
                    {"step": step, "tokens": tokens, "flops": flops, "metric": name, "value": value}
                )
            )
            if math.isfinite(value):  # MLflow stores NaN/Inf awkwardly; the curve keeps them
                items.append(
                    {"kind": "metric", "key": name, "value": value, "step": step, "ts": now}
                )
        self._curves.write("\n".join(lines) + "\n")
        self._curves.flush()
        if items:
            self._outbox.write("".join(json.dumps(i) + "\n" for i in items))
            self._outbox.flush()

    def set_tag(self, key: str, value: str) -> None:
        if self.enabled:
            self._put({"kind": "tag", "key": key, "value": str(value)})

    def finish(self, status: str | None, timeout_s: float = 30.0) -> bool:
        """Mark the run `status` (None: leave it RUNNING, e.g. when preempted), send what
        is left within `timeout_s`, and stop. Returns True if the outbox is fully sent."""
        if not self.enabled or self._sender is None:
            return True
        if status is not None:
            self._put({"kind": "status", "status": status})
        for f in (self._outbox, self._curves):
            f.close()
        self._sender.stdin.close()
        try:
            self._sender.wait(timeout_s)
        except subprocess.TimeoutExpired:
            # A slow sender (e.g. still importing MLflow on a crowded machine): take over and
            # send the rest from here once; if MLflow is down it waits in the outbox.
            self._sender.kill()
            self._sender.wait()
            takeover = threading.Thread(target=self._deliver_quietly, daemon=True)
            takeover.start()
            takeover.join(timeout_s)  # bounded: an unreachable server never blocks the exit
        return self.pending() == 0

    def _deliver_quietly(self) -> None:
        try:
            deliver_outbox(self.dir, self.run_id)
        except Exception:  # unreachable: a resumed job or the next sync sends the rest
            pass

    def pending(self) -> int:
        """Outbox lines not yet delivered."""
        return len(_unsent(self.dir)[0])

    @property
    def last_error(self) -> str | None:
        """The sender's last failure to reach MLflow (None after a successful send)."""
        path = self.dir / ERROR_FILE
        return path.read_text() or None if path.exists() else None


def _sender_loop(trial_dir: Path, run_id: str, interval: float) -> None:
    """The sender process: deliver every `interval` s; when stdin closes, deliver until
    done (or killed)."""
    os.nice(10)  # training first when cores are scarce; sending can wait
    closed = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), closed.set()), daemon=True).start()
    while True:
        stopping = closed.is_set()
        try:
            deliver_outbox(trial_dir, run_id)
            (trial_dir / ERROR_FILE).write_text("")
            if stopping:
                return
        except Exception as e:  # unreachable: keep the outbox, retry later
            (trial_dir / ERROR_FILE).write_text(f"{type(e).__name__}: {e}")
        time.sleep(interval) if stopping else closed.wait(interval)


def _unsent(trial_dir: Path) -> tuple[list[tuple[str, int]], int]:
    """Complete outbox lines after the delivered offset, each with the byte offset just
    past it."""
    path = trial_dir / OUTBOX_FILE
    if not path.exists():
        return [], 0
    offset_file = trial_dir / OFFSET_FILE
    offset = int(offset_file.read_text() or 0) if offset_file.exists() else 0
    with open(path, "rb") as f:
        f.seek(offset)
        data = f.read()
    lines, pos = [], offset
    for raw in data.split(b"\n")[:-1]:  # a line still being written is left for next time
        pos += len(raw) + 1
        lines.append((raw.decode("utf-8"), pos))
    return lines, pos


def deliver_outbox(trial_dir: Path, run_id: str) -> int:
    """Send every undelivered outbox line of a trial to MLflow; return how many were sent.
    Raises when MLflow cannot be reached (the outbox keeps the points)."""
    trial_dir.mkdir(parents=True, exist_ok=True)
    with open(trial_dir / LOCK_FILE, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one sender per trial (threads and processes)
        return _deliver_locked(trial_dir, run_id)


def _deliver_locked(trial_dir: Path, run_id: str) -> int:
    from mlflow.entities import Metric, Param, RunTag
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    from jobs.paths import tracking_uri

    lines, _ = _unsent(trial_dir)
    if not lines:
        return 0
    client = MlflowClient(tracking_uri())
    metrics, params, tags = [], [], []
    done = 0  # byte offset up to which everything is delivered

    def commit(offset: int) -> None:
        tmp = trial_dir / (OFFSET_FILE + ".tmp")
        tmp.write_text(str(offset))
        tmp.replace(trial_dir / OFFSET_FILE)

    def send() -> None:
        if metrics or params or tags:
            try:
                client.log_batch(run_id, metrics=metrics, params=params, tags=tags)
            except MlflowException as e:  # refused (not unreachable): keep it aside
                if e.error_code not in REJECTED_CODES:
                    raise
                if params:  # e.g. a param logged before with another value: set the
                    # params aside and still deliver the points and tags
                    with open(trial_dir / REJECTED_FILE, "a") as f:
                        f.write(json.dumps({"error": str(e), "params": len(params)}) + "\n")
                    params.clear()
                    send()
                    return
                with open(trial_dir / REJECTED_FILE, "a") as f:
                    f.write(json.dumps({"error": str(e), "n_metrics": len(metrics)}) + "\n")
                    f.writelines(
                        json.dumps({"key": m.key, "value": m.value, "step": m.step}) + "\n"
                        for m in metrics
                    )
        metrics.clear(), params.clear(), tags.clear()
        if done:
            commit(done)

    for line, end in lines:
        item = json.loads(line)
        kind = item["kind"]
        if kind == "metric":
            metrics.append(Metric(item["key"], item["value"], item["ts"], item["step"]))
        elif kind == "param":
            params.append(Param(item["key"], item["value"]))
        elif kind == "tag":
            tags.append(RunTag(item["key"], item["value"]))
        elif kind == "status":
            send()
            try:
                if item["status"] == "RUNNING":
                    client.update_run(run_id, status="RUNNING")
                else:
                    client.set_terminated(run_id, status=item["status"])
            except MlflowException as e:  # a refused transition must not block the rest
                if e.error_code not in REJECTED_CODES:
                    raise
            commit(end)
        done = end
        if len(metrics) >= MAX_METRICS or len(params) >= MAX_PARAMS or len(tags) >= MAX_TAGS:
            send()
    send()
    return len(lines)


if __name__ == "__main__":
    _sender_loop(Path(sys.argv[1]), sys.argv[2], float(sys.argv[3]))
