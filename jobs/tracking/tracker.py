"""MLflow tracking that never blocks training and never loses a point.

Only rank 0 tracks. Every point goes to the trial's curve file (`curves.jsonl`, read by the
results layer) and, with every tag, param and status change, to the run's spool
(`jobs/tracking/outbox.py`, one per run). A sender process delivers the spool with `log_batch`;
when MLflow is unreachable it retries later: the spool keeps everything across outages,
crashes and requeues, and whoever touches the trial next (a resumed job, a driver,
`scalelab status`, `scalelab results sync`) sends what is left. The job's last write is
its final status, so its run turns FINISHED only once every point has arrived.

Each (metric, position) is recorded once per sink, the position being the tokens trained:
a resumed job cuts curves.jsonl back to its checkpoint and rewrites what it replays there,
but does not spool a replayed position again (MLflow's history is append-only: the first
value sent stays; a bit-exact resume sends the same value anyway).
"""

from __future__ import annotations

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

from scalelab.contract.runs import Status
from scalelab.contract.workdir import CURVES_FILE
from scalelab.jobs.tracking.outbox import Busy, Outbox, metric

METRIC_NAME = re.compile(r"^[\w\-. :/]+$")  # what MLflow accepts
# How long a job's end waits for its spool to reach MLflow before leaving the rest spooled
FINISH_TIMEOUT_VAR = "SCALELAB_TRACKING_FINISH_TIMEOUT_S"
DEFAULT_FINISH_TIMEOUT_S = 30.0
# "off": curves.jsonl only, no MLflow run, spool or sender (a machine without MLflow, e.g.
# the GPU acceptance run on a node's own Python); "on" is the default
TRACKING_VAR = "SCALELAB_TRACKING"


class Tracker:
    """Rank 0's link to one MLflow run. On other ranks every method is a no-op."""

    def __init__(self, trial_dir: Path, enabled: bool, flush_interval_s: float = 1.0) -> None:
        self.dir, self.enabled, self.interval = Path(trial_dir), enabled, flush_interval_s
        self.finish_timeout_s = finish_timeout_s()  # read at the start: a bad value stops early
        self.curves_only = curves_only()
        self.run_id: str | None = None
        self.uri: str | None = None  # the run's tracking server, fixed when it starts
        self.outbox: Outbox | None = None
        self._sender: subprocess.Popen | None = None
        self._spool = self._curves = None
        self._spooled: dict[str, int] = {}  # metric -> furthest position in the spool
        self._curved: dict[str, int] = {}  # metric -> furthest position in curves.jsonl

    # -- set-up -----------------------------------------------------------------------
    def start(
        self,
        run_id: str | None,
        experiment: str,
        run_name: str,
        tags: dict[str, str],
        params: dict[str, str],
        resume_tokens: int | None = None,
    ) -> str | None:
        """Attach to `run_id` (or create a run), mark it RUNNING and start sending.
        `resume_tokens`: where training resumes (0 for a fresh start); curves.jsonl is cut
        back to it, and the run's spool gets the trial's points it lacks (points a previous
        run of the same trial recorded)."""
        if not self.enabled:
            return run_id
        if self.curves_only:
            self.dir.mkdir(parents=True, exist_ok=True)
            self._curved = _furthest(read_curve(self.dir, cut_at=resume_tokens))
            self._curves = open(self.dir / CURVES_FILE, "a")
            return run_id
        from scalelab.contract.workdir import tracking_uri

        self.uri = tracking_uri()
        self.dir.mkdir(parents=True, exist_ok=True)
        fresh_run = run_id is None
        if fresh_run:
            run_id = self._create_run(experiment, run_name)
        self.run_id = run_id
        self.outbox = Outbox(self.dir, run_id)
        curve = read_curve(self.dir, cut_at=resume_tokens)
        self._curved = _furthest(curve)
        new_spool = not self.outbox.exists()
        self.outbox.copy_curve(curve)
        self._spooled = self.outbox.positions()
        self._spool, self._curves = self.outbox.open(), open(self.dir / CURVES_FILE, "a")
        self._put({"kind": "status", "status": Status.RUNNING})
        for key, value in tags.items():
            self._put({"kind": "tag", "key": key, "value": str(value)})
        if fresh_run or new_spool:
            for key, value in params.items():
                self._put({"kind": "param", "key": key, "value": value})
        self._sender = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "scalelab.jobs.tracking.tracker",
                str(self.dir),
                run_id,
                str(self.interval),
            ],
            stdin=subprocess.PIPE,  # closing it means "send what is left, then exit"
            env={**os.environ, **fail_fast_environ(), "OMP_NUM_THREADS": "1"},
        )
        return run_id

    def _create_run(self, experiment: str, run_name: str) -> str:
        from scalelab.contract.workdir import artifact_root, tracking_uri
        from scalelab.jobs.tracking import mlflow_store as tracking_store

        try:  # one try: training does not wait for MLflow (the spool keeps what follows)
            client = tracking_store.client(one_try=True)
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
        self._spool.write(json.dumps(item) + "\n")
        self._spool.flush()

    def log(self, step: int, tokens: int, flops: float, metrics: dict[str, float]) -> None:
        """Record metrics at optimizer step `step`, position `tokens` (curves.jsonl + the
        spool), each sink skipping a position it already holds."""
        if not self.enabled:
            return
        now = int(time.time() * 1000)
        lines, items = [], []
        for name, value in metrics.items():
            if not METRIC_NAME.match(name):
                raise ValueError(f"{name!r} is not a valid MLflow metric name")
            value = float(value)
            if tokens > self._curved.get(name, -1):
                self._curved[name] = tokens
                point = {"step": step, "tokens": tokens, "flops": flops, "metric": name}
                lines.append(json.dumps(point | {"value": value}))
            # MLflow stores NaN/Inf awkwardly; the curve keeps them
            if tokens > self._spooled.get(name, -1) and math.isfinite(value):
                self._spooled[name] = tokens
                items.append(metric(name, value, step, tokens, now))
        if lines:
            self._curves.write("\n".join(lines) + "\n")
            self._curves.flush()
        if items and self._spool is not None:
            self._spool.write("".join(json.dumps(i) + "\n" for i in items))
            self._spool.flush()

    def set_tag(self, key: str, value: str) -> None:
        if self.enabled and self._spool is not None:
            self._put({"kind": "tag", "key": key, "value": str(value)})

    def finish(self, status: str | None, timeout_s: float | None = None) -> bool:
        """Spool the final `status` (None: leave the run RUNNING, e.g. when preempted), send
        what is left within `timeout_s` (default: SCALELAB_TRACKING_FINISH_TIMEOUT_S, 30 s),
        and stop. Returns True if the spool is fully sent; otherwise the rest waits in it for
        whoever touches the trial next."""
        if self.curves_only and self._curves is not None:
            self._curves.close()
        if not self.enabled or self._sender is None:
            return True
        timeout_s = self.finish_timeout_s if timeout_s is None else timeout_s
        if status is not None:
            self._put({"kind": "status", "status": status})
        for f in (self._spool, self._curves):
            f.close()
        self._sender.stdin.close()  # the sender sends what it holds, then exits
        # This process sends too: it is idle now, while the sender runs niced behind
        # training and on a busy machine may still be importing MLflow (a 12-step trial
        # waited the whole 30 s for it); the spool's lock lets one of them send at a time.
        deadline = time.monotonic() + timeout_s
        sending = threading.Thread(target=self._send_until, args=(deadline,), daemon=True)
        sending.start()
        sending.join(timeout_s)  # bounded: an unreachable server never blocks the exit
        self._sender.kill()  # all sent (nothing left for it), or out of time
        self._sender.wait()
        return self.pending() == 0

    def _send_until(self, deadline: float) -> None:
        """Deliver the spool to the run's own server until it is empty or `deadline`
        (monotonic) has passed. One try per request (jobs/tracking/one_try.py): MLflow's own
        backoff would hold the spool's lock for minutes, and whoever delivers next would wait
        on it. The lock is only tried, never waited on: a delivery that began after finish()
        returned would send what finish() reported as left for whoever comes next."""
        while time.monotonic() < deadline:
            try:
                self.outbox.deliver(self.uri, wait=False, one_try=True)
            except Busy:  # the sender (or a driver, `status`) is sending it
                pass
            except Exception:  # unreachable: the spool keeps it (its error file says why)
                pass
            if self.outbox.pending() == 0:
                return
            time.sleep(max(0.0, min(self.interval, deadline - time.monotonic())))

    def pending(self) -> int:
        """Spooled writes not yet sent (0 on ranks that do not track)."""
        return self.outbox.pending() if self.enabled and self.outbox else 0

    @property
    def last_error(self) -> str | None:
        """The sender's last failure to reach MLflow (None after a successful send)."""
        return self.outbox.last_error if self.outbox else None


def finish_timeout_s() -> float:
    """SCALELAB_TRACKING_FINISH_TIMEOUT_S in seconds (>= 0), else 30."""
    raw = os.environ.get(FINISH_TIMEOUT_VAR)
    if raw is None:
        return DEFAULT_FINISH_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{FINISH_TIMEOUT_VAR}={raw!r}: expected a number of seconds >= 0")
    return value


def curves_only() -> bool:
    """SCALELAB_TRACKING: "on" (default) or "off" (curves.jsonl only)."""
    raw = os.environ.get(TRACKING_VAR, "on")
    if raw not in ("on", "off"):
        raise ValueError(f"{TRACKING_VAR}={raw!r}: expected on or off")
    return raw == "off"


def fail_fast_environ() -> dict[str, str]:
    """MLflow's HTTP settings for the sender process: one try each, instead of retrying
    for minutes (the spool retries). In the environment of that child only, never of this
    process: every thread and later child would get them (`jobs/tracking/one_try.py` is the
    in-process equivalent)."""
    return {
        key: os.environ.get(key, default)
        for key, default in (
            ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0"),
            ("MLFLOW_HTTP_REQUEST_TIMEOUT", "10"),
        )
    }


def read_curve(trial_dir: Path, cut_at: int | None = None) -> list[dict[str, Any]]:
    """A trial's curves.jsonl points; with `cut_at`, the file is first cut back to the
    points at positions <= cut_at. A line torn by a kill or a full disk is dropped."""
    path = Path(trial_dir) / CURVES_FILE
    if not path.exists():
        return []
    points = []
    for line in path.read_text().splitlines():
        try:
            points.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    if cut_at is not None:
        points = [p for p in points if p["tokens"] <= cut_at]
        tmp = path.with_name(CURVES_FILE + ".tmp")
        tmp.write_text("".join(json.dumps(p) + "\n" for p in points))
        tmp.replace(path)
    return points


def _furthest(points: list[dict[str, Any]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for p in points:
        out[p["metric"]] = max(out.get(p["metric"], -1), p["tokens"])
    return out


def deliver_outbox(trial_dir: Path, run_id: str) -> int:
    """Send every unsent write of run `run_id` spooled in `trial_dir`; returns how many.
    Raises when MLflow cannot be reached (the spool keeps them)."""
    return Outbox(trial_dir, run_id).deliver()


def _sender_loop(outbox: Outbox, interval: float) -> None:
    """The sender process: deliver every `interval` s; when stdin closes, deliver until
    done (or killed)."""
    os.nice(10)  # training first when cores are scarce; sending can wait
    closed = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), closed.set()), daemon=True).start()
    while True:
        stopping = closed.is_set()
        try:
            outbox.deliver()  # waits while someone else (a driver, `status`) sends it
            if stopping:
                return
        except Exception:  # unreachable: keep the spool, retry later (error file has why)
            pass
        time.sleep(interval) if stopping else closed.wait(interval)


if __name__ == "__main__":
    _sender_loop(Outbox(Path(sys.argv[1]), sys.argv[2]), float(sys.argv[3]))
