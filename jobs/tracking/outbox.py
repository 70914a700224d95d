"""One MLflow run's spool: every write made to the run (metrics, tags, params, status
changes) is appended to a file first and sent to MLflow later, in order.

trials/<trial_id>/outbox/<run_id>/
  spool.jsonl      one JSON object per write, appended
  sent             byte offset up to which the spool has reached MLflow
  lock             held by whoever sends (one sender per run: threads and processes)
  error            the last failure to reach MLflow (empty after a success)
  rejected.jsonl   batches MLflow refused (invalid values), set aside

A job's last write is its run's final status, so a run is FINISHED in MLflow only once
every point spooled before it has arrived. A spooled status is not sent to a run that is
FAILED or KILLED in MLflow: its driver ended it after the job spooled that status (a cancel,
a job that died), and a spool sent later must not open it again (docs/reliability.md,
"Metrics are never lost"). Every metric write carries its position in training (`tokens`);
`positions()` says how far a spool got for each metric, which is how a resumed job avoids
spooling the steps it replays after its checkpoint a second time. One spool per run (not
per trial): two sweeps sharing a trial have two runs, and each gets the trial's whole curve
(`copy_curve`).
"""

from __future__ import annotations

import fcntl
import json
import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from scalelab.contract.runs import Status
from scalelab.jobs.tracking import mlflow_store as tracking_store

OUTBOX_DIR = "outbox"
MAX_METRICS, MAX_PARAMS, MAX_TAGS = 1000, 100, 100  # log_batch limits per call
# MLflow error codes meaning "the store answered and refused this batch" (retrying cannot
# help); anything else (connection refused, timeouts, 5xx) means "try again later".
REJECTED_CODES = {"INVALID_PARAMETER_VALUE", "BAD_REQUEST", "RESOURCE_DOES_NOT_EXIST"}
# A run its driver ended (cancelled: KILLED; failed out of its attempts: FAILED) keeps its
# status and end time: a spool sent late (`scalelab results sync`, `status`, a resubmit, or
# the sender of a job killed by a cancel) brings its points, params and tags, never a status.
# Only a new attempt opens such a run again, and its driver sets it SCHEDULED first
# (orchestrator/scheduler.py, `_launch`).
ENDED_BY_DRIVER = frozenset({Status.FAILED, Status.KILLED})


class Busy(RuntimeError):
    """Another process is sending this spool right now."""


class Outbox:
    """The spool of run `run_id` in a trial folder."""

    def __init__(self, trial_dir: Path, run_id: str) -> None:
        self.run_id = run_id
        self.dir = Path(trial_dir) / OUTBOX_DIR / run_id
        self.path = self.dir / "spool.jsonl"

    # -- writing ----------------------------------------------------------------------
    def open(self) -> Any:
        """The spool opened for appending (the job keeps it open while it runs)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        return open(self.path, "a", encoding="utf-8")

    def append(self, items: list[dict[str, Any]]) -> None:
        with self.open() as f:
            f.write("".join(json.dumps(i) + "\n" for i in items))

    # -- reading ----------------------------------------------------------------------
    def exists(self) -> bool:
        return self.path.exists()

    def _sent(self) -> int:
        path = self.dir / "sent"
        return int(path.read_text() or 0) if path.exists() else 0

    def unsent(self) -> list[tuple[str, int]]:
        """Complete lines not sent yet, each with the byte offset just past it (a line
        still being written is left for next time)."""
        if not self.path.exists():
            return []
        offset = self._sent()
        with open(self.path, "rb") as f:
            f.seek(offset)
            data = f.read()
        lines, pos = [], offset
        for raw in data.split(b"\n")[:-1]:
            pos += len(raw) + 1
            lines.append((raw.decode("utf-8"), pos))
        return lines

    def pending(self) -> int:
        """Writes not sent yet."""
        return len(self.unsent())

    @property
    def last_error(self) -> str | None:
        path = self.dir / "error"
        return (path.read_text() or None) if path.exists() else None

    def items(self) -> Iterator[dict[str, Any]]:
        """Every complete write in the spool, sent or not (a damaged line is skipped)."""
        if not self.path.exists():
            return
        with open(self.path, "rb") as f:
            for raw in f:
                if raw.endswith(b"\n") and (item := _decode(raw)) is not None:
                    yield item

    def positions(self) -> dict[str, int]:
        """For each metric, the furthest position (tokens trained) the spool holds."""
        out: dict[str, int] = {}
        for item in self.items():
            if item["kind"] == "metric":
                out[item["key"]] = max(out.get(item["key"], -1), item["tokens"])
        return out

    def final_status(self) -> str | None:
        """The last status change spooled, if any."""
        status = None
        for item in self.items():
            if item["kind"] == "status":
                status = item["status"]
        return status

    # -- copying a trial's curve --------------------------------------------------------
    def copy_curve(self, curve: list[dict[str, Any]], then_status: str | None = None) -> int:
        """Spool the points of `curve` (curves.jsonl rows) at positions this spool does not
        hold yet, then `then_status` unless it is already the last status; returns how
        many points were added. Idempotent: safe to call again, from several processes."""
        with self._locked(wait=True):
            have = self.positions()
            now = int(time.time() * 1000)
            items = []
            for p in curve:
                if p["tokens"] > have.get(p["metric"], -1) and math.isfinite(p["value"]):
                    items.append(metric(p["metric"], p["value"], p["step"], p["tokens"], now))
            if then_status and self.final_status() != then_status:
                items.append({"kind": "status", "status": then_status})
            if items:
                self.append(items)
            return sum(i["kind"] == "metric" for i in items)

    # -- sending ------------------------------------------------------------------------
    @contextmanager
    def _locked(self, wait: bool) -> Iterator[None]:
        self.dir.mkdir(parents=True, exist_ok=True)
        with open(self.dir / "lock", "w") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
            except BlockingIOError:
                raise Busy(f"{self.dir} is being sent by another process") from None
            yield

    def deliver(self, uri: str | None = None, wait: bool = True, one_try: bool = False) -> int:
        """Send every unsent write to MLflow, in order; returns how many were sent. Raises
        when MLflow cannot be reached (the spool keeps them), or Busy when `wait` is False
        and another process is sending. `one_try`: each request to a tracking server is
        tried once (`jobs/tracking/one_try.py`), for a caller that tries again later itself."""
        with self._locked(wait):
            try:
                n = self._deliver_locked(uri, one_try)
            except Exception as e:
                (self.dir / "error").write_text(f"{type(e).__name__}: {e}")
                raise
            (self.dir / "error").write_text("")
            return n

    def _commit(self, offset: int) -> None:
        tmp = self.dir / "sent.tmp"
        tmp.write_text(str(offset))
        tmp.replace(self.dir / "sent")

    def _set_aside(self, record: dict[str, Any], metrics: list[Any] = ()) -> None:
        with open(self.dir / "rejected.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")
            f.writelines(
                json.dumps({"key": m.key, "value": m.value, "step": m.step}) + "\n" for m in metrics
            )

    def _deliver_locked(self, uri: str | None, one_try: bool) -> int:
        from mlflow.entities import Metric, Param, RunTag
        from mlflow.exceptions import MlflowException

        lines = self.unsent()
        if not lines:
            return 0
        client = tracking_store.client(uri, one_try)
        run_id = self.run_id
        metrics, params, tags = [], [], []
        done = 0  # byte offset up to which everything is delivered

        def send() -> None:
            if metrics or params or tags:
                try:
                    client.log_batch(run_id, metrics=metrics, params=params, tags=tags)
                except MlflowException as e:  # refused (not unreachable): keep it aside
                    if e.error_code not in REJECTED_CODES:
                        raise
                    if params:  # e.g. a param logged before with another value: set the
                        # params aside and still deliver the points and tags
                        self._set_aside({"error": str(e), "params": len(params)})
                        params.clear()
                        send()
                        return
                    self._set_aside({"error": str(e), "n_metrics": len(metrics)}, metrics)
            metrics.clear(), params.clear(), tags.clear()
            if done:
                self._commit(done)

        for line, end in lines:
            item = _decode(line)
            if item is None:  # damaged on disk: set it aside rather than block the rest
                self._set_aside({"error": "not a spool line", "line": line[:1000]})
                done = end
                continue
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
                    if client.get_run(run_id).info.status in ENDED_BY_DRIVER:
                        pass  # history: its driver ended the run after this was spooled
                    elif item["status"] == Status.RUNNING:
                        tracking_store.set_open_status(client, run_id, Status.RUNNING)
                    else:
                        tracking_store.set_terminal(client, run_id, item["status"])
                except MlflowException as e:  # a refused transition must not block the rest
                    if e.error_code not in REJECTED_CODES:
                        raise
                self._commit(end)
            done = end
            if len(metrics) >= MAX_METRICS or len(params) >= MAX_PARAMS or len(tags) >= MAX_TAGS:
                send()
        send()
        return len(lines)


def _decode(line: str | bytes) -> dict[str, Any] | None:
    try:
        item = json.loads(line)
    except ValueError:
        return None
    return item if isinstance(item, dict) and "kind" in item else None


def metric(key: str, value: float, step: int, tokens: int, ts: int) -> dict[str, Any]:
    """A metric write: `step` is MLflow's x-axis, `tokens` the position in training."""
    return {"kind": "metric", "key": key, "value": value, "step": step, "tokens": tokens, "ts": ts}
