"""MLflow is the sweep's state: one parent run per sweep, one child run per trial.

Children are created up front with status SCHEDULED, so the UI shows the whole grid at once.
MLflow cannot move a run's start time, so at a trial's first launch its placeholder is
replaced by a run created then (`start_run`): the UI's Created and Duration are the real
ones. From that launch on the run id is the trial's identity across retries, requeues and
driver restarts.

Two drivers on one sweep never both launch a trial: a driver *claims* a trial by logging
the param `scalelab.claim.<n>` = its id. MLflow params are write-once (a second, different
value is rejected by the store, atomically), so exactly one driver wins epoch n. A claim
lapses when its driver is gone: on this host its pid is dead, or its heartbeat (a tag on
the parent run) is older than the lease; then the next epoch can be claimed.
Run creation races (two drivers creating the same trial's run at once) are settled by
keeping the oldest run per trial and deleting the others, after a short settling delay.
"""

from __future__ import annotations

import functools
import json
import os
import socket
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scalelab.contract import workdir
from scalelab.contract.runs import (
    TERMINAL,
    ExperimentTag,
    Param,
    Role,
    Status,
    Tag,
    cancelled_filter,
    search_all,
    sweep_experiment,
    sweep_filter,
    sweep_run_name,
    trials_filter,
)
from scalelab.jobs import identity
from scalelab.jobs.tracking import store as tracking_store
from scalelab.jobs.tracking.provenance import code_version, mlflow_params
from scalelab.orchestrator.trial_names import run_names, swept_settings

if TYPE_CHECKING:
    from mlflow import MlflowClient

    from scalelab.orchestrator.expand import Trial
    from scalelab.orchestrator.spec import SweepSpec

SETTLE_S = 0.5  # > the time from creating a run to seeing it in a search, with margin
MAX_TAG = 8000


class LedgerUnavailable(RuntimeError):
    """The tracking store cannot be reached, or failed (unreachable, disk full, locked);
    the message is one line. MLflow keeps what was written before: a later submit of the
    same sweep picks up from there."""


class _GuardedClient:
    """An MlflowClient whose store failures raise LedgerUnavailable with one line; its
    refusals (a param already set, an experiment that exists) stay MlflowExceptions."""

    def __init__(self, client: MlflowClient, uri: str) -> None:
        self._client, self._uri = client, uri

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._client, name)
        if not callable(attr):
            return attr

        @functools.wraps(attr)
        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                return attr(*args, **kwargs)
            except Exception as e:
                why = tracking_store.failure(e)
                if why is None:
                    raise
                raise LedgerUnavailable(f"the tracking store {self._uri} failed: {why}") from None

        return call


def _client(uri: str, one_try: bool = False) -> MlflowClient:
    """A guarded client; `one_try`: each request to a tracking server is tried once, with a
    short timeout (`jobs/tracking/one_try.py`), for calls a periodic poll repeats at its next tick."""
    try:
        client = tracking_store.client(uri, one_try)
    except tracking_store.StoreError as e:
        raise LedgerUnavailable(str(e)) from None
    return _GuardedClient(client, uri)  # type: ignore[return-value]


@dataclass
class TrialRecord:
    """What MLflow knows about one trial's run."""

    run_id: str
    trial_id: str
    status: str
    tags: dict[str, str] = field(default_factory=dict)
    params: dict[str, str] = field(default_factory=dict)
    start_time: int = 0  # ms; created then: the placeholder at scheduling, else its first launch
    end_time: int = 0  # ms; 0 while it has not ended
    metrics: dict[str, float] = field(default_factory=dict)  # each metric's latest value
    name: str = ""

    @property
    def attempts(self) -> int:
        return int(self.tags.get(Tag.ATTEMPTS, "0"))

    @property
    def claim(self) -> tuple[int, str | None]:
        """(epoch, driver id) of the latest claim; (-1, None) when never claimed."""
        epochs = [
            (int(k[len(Param.CLAIM_PREFIX) :]), v)
            for k, v in self.params.items()
            if k.startswith(Param.CLAIM_PREFIX)
        ]
        return max(epochs) if epochs else (-1, None)

    @property
    def cancelled(self) -> bool:
        return self.tags.get(Tag.CANCEL) == "1"

    @property
    def launched(self) -> bool:
        """Launched once at least: not the placeholder made at scheduling (`start_run`)."""
        return Tag.STARTED_MS in self.tags or Tag.JOB_REF in self.tags or self.attempts > 0


def new_driver_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


def check_reachable(uri: str, timeout_s: float = 5.0) -> None:
    """Fail fast (LedgerUnavailable) when an MLflow server is down, before any write."""
    if uri.startswith(("http://", "https://")):
        try:
            with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout_s) as r:
                if r.status != 200:
                    raise LedgerUnavailable(f"MLflow server {uri} answered HTTP {r.status}")
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise LedgerUnavailable(f"MLflow server {uri} is not reachable: {reason}") from None
    elif uri.startswith("sqlite:///"):
        db = Path(uri.removeprefix("sqlite:///"))
        if not db.parent.is_dir():
            raise LedgerUnavailable(f"the folder of the MLflow database {db} does not exist")


class Ledger:
    """One sweep's runs in MLflow."""

    def __init__(
        self,
        sweep: str,
        experiment: str | None = None,
        tracking_uri: str | None = None,
        driver_id: str | None = None,
        lease_s: float = 60.0,
    ):
        self.sweep = sweep
        self.experiment = experiment or sweep
        self.uri = tracking_uri or workdir.tracking_uri()
        check_reachable(self.uri)
        self.client: MlflowClient = _client(self.uri)
        self._poll_client: MlflowClient | None = None  # made at the first poll
        self.driver_id = driver_id or new_driver_id()
        self.lease_s = lease_s
        self._experiment_id: str | None = None
        self.parent_id: str | None = None

    def map(self, fn: Callable[[Any], Any], items: list[Any]) -> list[Any]:
        """fn over items: in threads for a tracking server (it serves requests at once);
        one by one on sqlite, whose writers queue on a file lock (threads only add the
        lock's busy-wait backoff)."""
        if self.uri.startswith("sqlite") or len(items) < 2:
            return [fn(item) for item in items]
        return list(_pool().map(fn, items))

    # ------------------------------------------------------------ lookup

    def experiment_id(self, create: bool = False) -> str | None:
        if self._experiment_id is None:
            exp = self.client.get_experiment_by_name(self.experiment)
            if exp is None and create:
                from mlflow.exceptions import MlflowException

                try:
                    artifacts = workdir.artifact_root().as_uri()
                    location = None if self.uri.startswith("http") else artifacts
                    self._experiment_id = self.client.create_experiment(self.experiment, location)
                except MlflowException:  # another driver created it just now (or a refusal)
                    exp = self.client.get_experiment_by_name(self.experiment)
                    if exp is None:
                        raise
            if exp is not None:
                self._experiment_id = exp.experiment_id
        return self._experiment_id

    @property
    def poll_client(self) -> MlflowClient:
        """For the driver's periodic polls (heartbeats, cancels): one try per request, so a
        poll during an outage fails at once (LedgerUnavailable) and the next tick asks again;
        MLflow's retry chain would keep the driver waiting up to a minute after the store is
        back. Writes that must land use `client` (MLflow's retries) or a spool."""
        if self._poll_client is None:
            self._poll_client = _client(self.uri, one_try=True)
        return self._poll_client

    def _search(self, filter_string: str, client: MlflowClient | None = None) -> list[Any]:
        eid = self.experiment_id()
        if eid is None:
            return []
        return search_all(client or self.client, [eid], filter_string)

    def find_parent(self) -> str | None:
        if self.parent_id is None:
            runs = self._search(sweep_filter(self.sweep))
            if runs:
                self.parent_id = min(
                    runs, key=lambda r: (r.info.start_time, r.info.run_id)
                ).info.run_id
        return self.parent_id

    def records(self) -> dict[str, TrialRecord]:
        """The trials' runs, by trial id (one search, paged)."""
        runs = self._search(trials_filter(self.sweep))
        out: dict[str, TrialRecord] = {}

        # a started run before a placeholder (one a driver stopped in start_run left
        # behind); else the oldest: the winner of a creation race (sync)
        def rank(run: Any) -> tuple[bool, int, str]:
            placeholder = Tag.STARTED_MS not in run.data.tags
            return placeholder, run.info.start_time, run.info.run_id

        for run in sorted(runs, key=rank):
            tid = run.data.tags.get(Tag.TRIAL_ID)
            if tid and tid not in out:
                out[tid] = _record(run)
        return out

    def record(self, run_id: str) -> TrialRecord:
        return _record(self.client.get_run(run_id))

    def records_of(self, run_ids: list[str]) -> dict[str, TrialRecord]:
        """Fresh records of some runs, by run id (one search per 100 runs)."""
        out: dict[str, TrialRecord] = {}
        for i in range(0, len(run_ids), 100):
            chunk = ", ".join(f"'{r}'" for r in run_ids[i : i + 100])
            for run in self._search(f"attributes.run_id IN ({chunk})"):
                out[run.info.run_id] = _record(run)
        return out

    def statuses(self) -> dict[str, str]:
        return {tid: rec.status for tid, rec in self.records().items()}

    # ------------------------------------------------------------ creation

    def describe_experiment(self, spec: SweepSpec) -> None:
        """Tell the MLflow UI what the experiment is: model training (it opens on the runs,
        not the GenAI overview) and the sweep's description as its note."""
        eid = self.experiment_id(create=True)
        tags = {ExperimentTag.KIND: ExperimentTag.TRAINING}
        if spec.description:
            tags[ExperimentTag.NOTE] = spec.description
        from mlflow.exceptions import MlflowException

        current = self.client.get_experiment(eid).tags
        for key, value in tags.items():
            if current.get(key) == value:
                continue
            try:
                self.client.set_experiment_tag(eid, key, value)
            except MlflowException:  # a second driver set it at once (a unique key)
                if self.client.get_experiment(eid).tags.get(key) != value:
                    raise

    def ensure_parent(
        self, spec: SweepSpec, spec_yaml: str = "", spec_path: str = "", overrides: str = "[]"
    ) -> str:
        """The sweep's parent run (created if missing), tagged with its YAML, path and
        command-line overrides (a JSON list of KEY=VALUE) for `resume`."""
        self.describe_experiment(spec)
        if self.find_parent():
            self._update_parent_tags(spec, spec_yaml, spec_path, overrides)
            return self.parent_id
        eid = self.experiment_id(create=True)
        tags = {
            Tag.RUN_NAME: sweep_run_name(self.sweep),
            Tag.ROLE: Role.SWEEP,
            Tag.SWEEP: self.sweep,
            Tag.CODE_VERSION: code_version(),
        }
        run = self.client.create_run(eid, tags=tags, run_name=sweep_run_name(self.sweep))
        time.sleep(SETTLE_S)
        self.parent_id = None
        parent = self.find_parent()
        if parent != run.info.run_id:
            self.client.delete_run(run.info.run_id)  # lost a creation race: use the winner's
        else:
            self.client.update_run(parent, status=Status.SCHEDULED)
        self._update_parent_tags(spec, spec_yaml, spec_path, overrides)
        return parent

    def _update_parent_tags(
        self, spec: SweepSpec, spec_yaml: str, spec_path: str, overrides: str
    ) -> None:
        from mlflow.entities import RunTag

        tags = {Tag.BACKEND: spec.backend.kind, Tag.OVERRIDES: overrides}
        if spec_yaml and len(spec_yaml) <= MAX_TAG:
            tags[Tag.SPEC_YAML] = spec_yaml
        if spec_path:
            tags[Tag.SPEC_PATH] = spec_path
        self.client.log_batch(self.parent_id, tags=[RunTag(k, v) for k, v in tags.items()])

    def sync(
        self, spec: SweepSpec, trials: list[Trial], **parent_info: str
    ) -> dict[str, TrialRecord]:
        """Create the parent and every missing child run (SCHEDULED); never duplicates."""
        from mlflow.entities import Param as MlflowParam
        from mlflow.entities import RunTag

        parent = self.ensure_parent(spec, **parent_info)
        existing = self.records()
        missing = [t for t in trials if t.trial_id not in existing]
        if not missing:
            return existing
        eid = self.experiment_id()
        names, swept = run_names(trials), swept_settings(trials)

        def create(t: Trial) -> str:
            tags = {
                Tag.PARENT_RUN_ID: parent,
                Tag.RUN_NAME: names[t.trial_id],
                Tag.ROLE: Role.TRIAL,
                Tag.SWEPT: json.dumps(swept[t.trial_id]),
                Tag.TOKENS: str(t.tokens),
                Tag.SWEEP: self.sweep,
                Tag.TRIAL_ID: t.trial_id,
                Tag.VARIANT: t.variant,
                Tag.SIZE: t.size,
                Tag.BACKEND: spec.backend.kind,
                Tag.CODE_VERSION: code_version(),
                Tag.ATTEMPTS: "0",
                Tag.IDENTITY_RULE: identity.IDENTITY_RULE,
            }
            run = self.client.create_run(eid, tags=tags, run_name=tags[Tag.RUN_NAME])
            params = mlflow_params(t.job) | {Param.N_PARAMS: str(t.n_params)}
            if "train.tokens" not in params:  # a budget in FLOPs or tokens per parameter
                params[Param.TOKENS] = str(t.tokens)
            params[Param.IDENTITY] = identity.canonical_json(t.job.identity_tree())
            items = [MlflowParam(k, v) for k, v in params.items()]
            for i in range(0, len(items), 100):
                self.client.log_batch(run.info.run_id, params=items[i : i + 100])
            self.client.update_run(run.info.run_id, status=Status.SCHEDULED)
            return run.info.run_id

        created = self.map(create, missing)
        time.sleep(SETTLE_S)
        records = self.records()
        keep = {rec.run_id for rec in records.values()}
        for run_id in created:
            if run_id not in keep:  # another driver created this trial first
                self.client.delete_run(run_id)
        self.client.log_batch(parent, tags=[RunTag(Tag.N_TRIALS, str(len(records)))])
        return records

    # ------------------------------------------------------------ claims and heartbeats

    def heartbeat(self, poll: bool = False) -> None:
        """Tell other drivers this one is alive; `poll`: a periodic beat, tried once
        (`poll_client`)."""
        host, pid, _ = self.driver_id.split(":")
        beat = json.dumps({"t": time.time(), "host": host, "pid": int(pid)})
        client = self.poll_client if poll else self.client
        client.set_tag(self.parent_id, f"{Tag.DRIVER_PREFIX}{_tag_safe(self.driver_id)}", beat)

    def driver_alive(self, driver_id: str | None, parent_tags: dict[str, str]) -> bool:
        if driver_id is None:
            return False
        if driver_id == self.driver_id:
            return True
        raw = parent_tags.get(f"{Tag.DRIVER_PREFIX}{_tag_safe(driver_id)}")
        if raw is None:
            return False
        beat = json.loads(raw)
        if beat["host"] == socket.gethostname() and not _pid_alive(beat["pid"]):
            return False
        return time.time() - beat["t"] < self.lease_s

    def live_drivers(self, parent_tags: dict[str, str]) -> list[str]:
        """The drivers of this sweep whose heartbeat is fresh (other than this one)."""
        live = []
        for key, raw in parent_tags.items():
            if not key.startswith(Tag.DRIVER_PREFIX) or key.endswith(_tag_safe(self.driver_id)):
                continue
            beat = json.loads(raw)
            if beat["host"] == socket.gethostname() and not _pid_alive(beat["pid"]):
                continue
            if time.time() - beat["t"] < self.lease_s:
                live.append(key.removeprefix(Tag.DRIVER_PREFIX))
        return live

    def parent_tags(self) -> dict[str, str]:
        return self.client.get_run(self.parent_id).data.tags

    def claim(self, rec: TrialRecord, parent_tags: dict[str, str] | None = None) -> bool:
        """Try to own a trial; True when this driver owns it now."""
        from mlflow.exceptions import MlflowException

        epoch, owner = rec.claim
        if owner == self.driver_id:
            return True
        if owner is not None and self.driver_alive(owner, parent_tags or self.parent_tags()):
            return False
        try:
            self.client.log_param(rec.run_id, f"{Param.CLAIM_PREFIX}{epoch + 1}", self.driver_id)
        except MlflowException:
            return False  # another driver logged this epoch first
        rec.params[f"{Param.CLAIM_PREFIX}{epoch + 1}"] = self.driver_id
        return True

    # ------------------------------------------------------------ transitions

    def set_tags(self, run_id: str, tags: dict[str, str]) -> None:
        from mlflow.entities import RunTag

        self.client.log_batch(run_id, tags=[RunTag(k, v[:MAX_TAG]) for k, v in tags.items()])

    def started(self, rec: TrialRecord, attempt: int) -> None:
        self.set_tags(rec.run_id, {Tag.ATTEMPTS: str(attempt)})
        rec.tags[Tag.ATTEMPTS] = str(attempt)

    def start_run(self, rec: TrialRecord) -> TrialRecord:
        """A trial's first launch: its placeholder (created SCHEDULED at scheduling) is
        replaced by a run created now, with every tag and param of the placeholder (the
        claims too) plus when it started and how long it queued; MLflow cannot move a run's
        start time. The placeholder is deleted; a cancel that landed on it meanwhile is
        carried over (`request_cancel` handles one that comes after the delete)."""
        from mlflow.entities import Param as MlflowParam
        from mlflow.entities import RunTag

        now_ms = int(time.time() * 1000)
        run = self.client.create_run(
            self.experiment_id(), start_time=now_ms, tags=rec.tags, run_name=rec.name or None
        )
        run_id = run.info.run_id
        self.set_status(run_id, Status.SCHEDULED)  # RUNNING once the job runs
        items = [MlflowParam(k, v) for k, v in rec.params.items()]
        batches = [items[i : i + 100] for i in range(0, len(items), 100)] or [[]]
        for batch in batches[:-1]:
            self.client.log_batch(run_id, params=batch)
        # last, with the final params: a run tagged started is a whole copy (records()
        # prefers it to the placeholder, should this driver stop before the delete)
        queued_s = f"{(now_ms - rec.start_time) / 1000:.1f}"
        started = [RunTag(Tag.STARTED_MS, str(now_ms)), RunTag(Tag.QUEUED_S, queued_s)]
        self.client.log_batch(run_id, params=batches[-1], tags=started)
        self.client.delete_run(rec.run_id)
        if self.client.get_run(rec.run_id).data.tags.get(Tag.CANCEL) == "1":
            self.client.log_batch(run_id, tags=[RunTag(Tag.CANCEL, "1")])
        return self.record(run_id)  # a cancel may have come to this run already

    def set_status(self, run_id: str, status: str) -> None:
        if status in TERMINAL:
            self.client.set_terminated(run_id, status=status)
        else:
            self.client.update_run(run_id, status=status)

    def finish_sweep(self, status: str) -> None:
        if self.parent_id:
            self.set_status(self.parent_id, status)

    def request_cancel(self, trial_ids: list[str] | None = None) -> list[str]:
        """Mark trials cancelled; SCHEDULED ones become KILLED at once. Returns run ids."""
        recs = self.records()
        chosen = [tid for tid in recs if trial_ids is None or tid in trial_ids]
        touched = []
        for tid in chosen:
            run_id = self._cancel(tid, recs[tid])
            if run_id is not None:
                touched.append(run_id)
        return touched

    def _cancel(self, trial_id: str, rec: TrialRecord) -> str | None:
        """Cancel one trial's live run: when `start_run` replaced the run read (deleted:
        a write fails, or the write landed after the delete), again on its new run."""
        from mlflow.exceptions import MlflowException

        for _ in range(3):
            if rec.status in TERMINAL:
                return None
            try:
                self.set_tags(rec.run_id, {Tag.CANCEL: "1"})
                if rec.status == Status.SCHEDULED:
                    self.set_status(rec.run_id, Status.KILLED)
                if self.client.get_run(rec.run_id).info.lifecycle_stage != "deleted":
                    return rec.run_id
            except MlflowException:
                if self.client.get_run(rec.run_id).info.lifecycle_stage != "deleted":
                    raise
            fresh = self.records().get(trial_id)
            if fresh is None or fresh.run_id == rec.run_id:
                return None
            rec = fresh
        raise LedgerUnavailable(f"trial {trial_id}'s run kept being replaced while cancelling")

    def cancelled_run_ids(self) -> set[str]:
        """The sweep's runs marked cancelled: a periodic poll, tried once (`poll_client`)."""
        runs = self._search(cancelled_filter(self.sweep), self.poll_client)
        return {r.info.run_id for r in runs}


@cache
def _pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=8, thread_name_prefix="scalelab-ledger")


def _record(run: Any) -> TrialRecord:
    return TrialRecord(
        run_id=run.info.run_id,
        trial_id=run.data.tags.get(Tag.TRIAL_ID, ""),
        status=run.info.status,
        tags=dict(run.data.tags),
        params=dict(run.data.params),
        start_time=run.info.start_time or 0,
        end_time=run.info.end_time or 0,
        metrics=dict(run.data.metrics),
        name=run.info.run_name or "",
    )


def _tag_safe(driver_id: str) -> str:
    return driver_id.replace(":", "_")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def find_sweep(name: str, tracking_uri: str | None = None) -> Ledger:
    """The ledger of a sweep by name, whatever experiment it lives in."""
    uri = tracking_uri or workdir.tracking_uri()
    check_reachable(uri)
    exp = sweep_experiment(_client(uri), name)
    if exp is None:
        raise LookupError(f"no sweep named {name!r} in {uri}")
    ledger = Ledger(name, exp.name, uri)
    ledger.find_parent()
    return ledger
