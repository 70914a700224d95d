"""Metrics a trial still owes MLflow, and who sends them.

A run turns FINISHED in MLflow only once its spool (`jobs/tracking/outbox.py`) is sent to the end:
the job's last spooled write is its final status, and the driver marks a run FINISHED only
when nothing is left in it. A trial that finished training while MLflow was unreachable
therefore stays RUNNING in MLflow while its folder's `result.json` says the training is
done, and whoever touches it next sends the rest: a later driver (which never trains it
again), `scalelab status`, `scalelab results sync`. A trial trained under another run (two
sweeps sharing a trial in one work directory) is *adopted*: the trial's curve is copied
into this run's spool, then sent like any other.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

from scalelab.contract import workdir
from scalelab.contract.outcome import trained
from scalelab.contract.runs import Status, Tag
from scalelab.jobs.tracking import mlflow_store as tracking_store
from scalelab.jobs.tracking.outbox import Busy, Outbox
from scalelab.jobs.tracking.tracker import read_curve


class RunOfTrial(Protocol):
    run_id: str
    trial_id: str
    status: str


def adopt(trial_id: str, run_id: str) -> Outbox:
    """Make run `run_id` record the trial's finished training: spool the curve points it
    lacks and then FINISHED (nothing when they are spooled already). Idempotent."""
    outbox = Outbox(workdir.trial_dir(trial_id), run_id)
    result = trained(trial_id) or {}
    if result.get("run_id") not in (None, run_id) and not outbox.exists():
        outbox.append([{"kind": "tag", "key": Tag.TRAINED_IN_RUN, "value": result["run_id"]}])
    outbox.copy_curve(read_curve(workdir.trial_dir(trial_id)), then_status=Status.FINISHED)
    return outbox


@dataclass(frozen=True)
class Owed:
    """A run whose spool still holds writes after an attempt to send them."""

    trial_id: str
    run_id: str
    pending: int
    why: str


def send_owed(runs: Iterable[RunOfTrial], uri: str | None = None) -> tuple[int, list[Owed]]:
    """Send what the spools of these runs (those not FINISHED) still hold, without waiting
    for a spool another process is sending. Returns (writes sent, runs still owing)."""
    sent, owed = 0, []
    for run in runs:
        if run.status == Status.FINISHED:
            continue
        outbox = Outbox(workdir.trial_dir(run.trial_id), run.run_id)
        if not outbox.pending():
            continue
        why = ""
        try:
            sent += outbox.deliver(uri, wait=False)
        except Busy:
            why = "being sent by its job or another scalelab command"
        except Exception as e:
            why = f"MLflow unreachable: {tracking_store.failure(e, uri) or e}"
        if left := outbox.pending():
            owed.append(Owed(run.trial_id, run.run_id, left, why))
    return sent, owed


@dataclass
class _Send:
    trial_id: str
    adopt: bool
    future: Future | None = None
    not_before: float = 0.0


class Deliveries:
    """The driver's sends of finished trials' spools: in a background thread (an outage
    never stalls the scheduler), retried every `retry_s` until nothing is left. Each try
    makes one request per batch (`jobs/tracking/one_try.py`): a try while MLflow is down fails at
    once, so retrying often costs nothing and a send starts soon after it is back."""

    def __init__(self, uri: str | None = None, retry_s: float = 2.0) -> None:
        self.uri, self.retry_s = uri, retry_s
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="scalelab-outbox")
        self._owed: dict[str, _Send] = {}  # by run id

    def add(self, trial_id: str, run_id: str, adopt: bool = False) -> None:
        self._owed[run_id] = _Send(trial_id, adopt)

    def __len__(self) -> int:
        return len(self._owed)

    def _send(self, trial_id: str, run_id: str, adopt_first: bool) -> int:
        outbox = (
            adopt(trial_id, run_id) if adopt_first else Outbox(workdir.trial_dir(trial_id), run_id)
        )
        outbox.deliver(self.uri, one_try=True)  # poll() tries again after retry_s
        return outbox.pending()

    def poll(self) -> list[tuple[str, str]]:
        """(trial id, run id) of the runs whose spool is now sent to the end."""
        done, now = [], time.monotonic()
        for run_id, send in list(self._owed.items()):
            if send.future is not None and send.future.done():
                if send.future.exception() is None and send.future.result() == 0:
                    del self._owed[run_id]
                    done.append((send.trial_id, run_id))
                    continue
                send.future, send.not_before = None, now + self.retry_s
            if send.future is None and now >= send.not_before:
                send.future = self._pool.submit(self._send, send.trial_id, run_id, send.adopt)
        return done

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def trained_elsewhere(trials: list[Any], records: dict[str, Any], finished: set[str]) -> set[str]:
    """The trials not FINISHED here whose training another sweep's run finished: their
    curves are copied (scheduler._adopt_trained), nothing is trained."""
    out = set()
    for tid in (t.trial_id for t in trials if t.trial_id not in finished):
        rec = records.get(tid)
        trained_in = (trained(tid) or {}).get("run_id")
        if trained_in is not None and (rec is None or trained_in != rec.run_id):
            out.add(tid)
    return out
