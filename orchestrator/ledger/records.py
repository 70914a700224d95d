"""One run per trial. Trials are created up front as placeholders with status SCHEDULED, so
the UI shows the whole grid at once. At a trial's first launch its placeholder's start time
is moved to then (`start_runs`), so the UI's Created and Duration are the real ones; a
tracking server's API cannot move a start time, so there the placeholder is replaced by a
run created then. From that launch on the run id is the trial's identity across retries,
requeues and driver restarts. Run creation races (two drivers creating the same trial's
run at once) are settled by keeping the oldest run per trial and deleting the others, after
a short settling delay."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from scalelab.contract.runs import (
    TERMINAL,
    Param,
    Role,
    Status,
    Tag,
    cancelled_filter,
    tag_filter,
    trials_filter,
)
from scalelab.contract.trial_time import launched, timestamp_text, trial_run_rank
from scalelab.jobs import identity
from scalelab.jobs.tracking.provenance import code_version, mlflow_params
from scalelab.orchestrator.ledger.connection import LedgerUnavailable, SweepStore
from scalelab.orchestrator.ledger.parent import SETTLE_S
from scalelab.orchestrator.ledger.ui_view import variant_colours
from scalelab.orchestrator.plan.trial_names import run_names, swept_settings

if TYPE_CHECKING:
    from scalelab.orchestrator.plan.expand import Trial
    from scalelab.orchestrator.plan.spec import SweepSpec


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
    artifact_uri: str = ""  # where the run's artifacts go (its trial attaches its logs there)

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
        return launched(self.tags) or Tag.JOB_REF in self.tags or self.attempts > 0


def _start_tags(placeholder: TrialRecord, now_ms: int) -> dict[str, str]:
    """A first launch's tags: when it started (the trial, and its first attempt: `status`
    shows it STARTING until its job runs), and how long it queued since its submit."""
    queued_s = (now_ms - placeholder.start_time) / 1000
    at = timestamp_text(now_ms)
    return {Tag.STARTED: at, Tag.LAUNCHED: at, Tag.QUEUED_S: f"{queued_s:.1f}"}


def record_of(run: Any) -> TrialRecord:
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
        artifact_uri=run.info.artifact_uri or "",
    )


def latest_records(runs: list[Any]) -> dict[str, TrialRecord]:
    """The record of each trial among its runs, by trial id: a started run before a
    placeholder (one a driver stopped in start_run left behind); else the oldest, the
    winner of a creation race (create_placeholders)."""

    out: dict[str, TrialRecord] = {}
    for run in sorted(runs, key=trial_run_rank):
        tid = run.data.tags.get(Tag.TRIAL_ID)
        if tid and tid not in out:
            out[tid] = record_of(run)
    return out


class Records(SweepStore):
    def records(self) -> dict[str, TrialRecord]:
        """The trials' runs, by trial id (one search, paged)."""
        return latest_records(self.search(trials_filter(self.sweep)))

    def record(self, run_id: str) -> TrialRecord:
        return record_of(self.client.get_run(run_id))

    def records_of(self, run_ids: list[str]) -> dict[str, TrialRecord]:
        """Fresh records of some runs, by run id (one search per 100 runs)."""
        out: dict[str, TrialRecord] = {}
        for i in range(0, len(run_ids), 100):
            chunk = ", ".join(f"'{r}'" for r in run_ids[i : i + 100])
            for run in self.search(f"attributes.run_id IN ({chunk})"):
                out[run.info.run_id] = record_of(run)
        return out

    def statuses(self) -> dict[str, str]:
        return {tid: rec.status for tid, rec in self.records().items()}

    def create_placeholders(
        self, parent: str, spec: SweepSpec, trials: list[Trial]
    ) -> dict[str, TrialRecord]:
        """A SCHEDULED run for every trial that has none; never duplicates. The records of
        every trial of the sweep."""
        from mlflow.entities import Param as MlflowParam
        from mlflow.entities import RunTag

        existing = self.records()
        missing = [t for t in trials if t.trial_id not in existing]
        if not missing:
            return existing
        eid = self.experiment_id()
        names, swept = run_names(trials), swept_settings(trials)
        colours = variant_colours(t.variant for t in trials)

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
                Tag.RUN_COLOR: colours[t.variant],
            }
            if t.stage:
                tags[Tag.STAGE] = t.stage
            run = self.client.create_run(eid, tags=tags, run_name=tags[Tag.RUN_NAME])
            params = mlflow_params(t.job) | {Param.N_PARAMS: str(t.n_params)}
            if "train.tokens" not in params:  # a budget in FLOPs or tokens per parameter
                params[Param.TOKENS] = str(t.tokens)
            params[Param.IDENTITY] = identity.canonical_json(t.job.identity_tree())
            items = [MlflowParam(k, v) for k, v in params.items()]
            for i in range(0, len(items), 100):
                self.client.log_batch(run.info.run_id, params=items[i : i + 100])
            self.client.set_open_status(run.info.run_id, Status.SCHEDULED)
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

    def started(self, rec: TrialRecord, attempt: int) -> None:
        self.set_tags(rec.run_id, {Tag.ATTEMPTS: str(attempt)})
        rec.tags[Tag.ATTEMPTS] = str(attempt)

    def start_run(self, rec: TrialRecord) -> TrialRecord:
        return self.start_runs([rec])[0]

    def start_runs(
        self, recs: list[TrialRecord], launch_tags: list[dict[str, str]] | None = None
    ) -> list[TrialRecord]:
        """Trials' first launch. Each placeholder (created SCHEDULED at submit) becomes the
        run of a trial that starts now: its start time moved to now, so that the UI's
        Created and Duration are the trial's, and tagged with when it started, how long it
        queued and the launch's own tags (`launch_tags`, per record). A tracking server's
        API cannot move a start time: there each placeholder is replaced (`_replace`)."""
        if not recs:
            return []
        now_ms = int(time.time() * 1000)
        pairs = list(zip(recs, launch_tags or [{} for _ in recs], strict=True))
        if self.client.move_start_time([rec.run_id for rec in recs], now_ms):
            return self.map(lambda pair: self._started_in_place(*pair, now_ms), pairs)
        started = self.map(lambda pair: self._replace(*pair, now_ms), pairs)
        for new in self._cancelled_placeholders(recs, started):
            self.set_tags(new.run_id, {Tag.CANCEL: "1"})
            new.tags[Tag.CANCEL] = "1"
        return started

    def _started_in_place(
        self, rec: TrialRecord, launch_tags: dict[str, str], now_ms: int
    ) -> TrialRecord:
        """The placeholder, its start moved to `now_ms`, tagged as started (one write; a
        placeholder cancelled before this submit is SCHEDULED again, as a new run would be)."""
        from mlflow.entities import RunTag

        tags = launch_tags | _start_tags(rec, now_ms)
        self.client.log_batch(rec.run_id, tags=[RunTag(k, v) for k, v in tags.items()])
        if rec.status != Status.SCHEDULED:
            self.set_status(rec.run_id, Status.SCHEDULED)
        return replace(
            rec, status=Status.SCHEDULED, tags=rec.tags | tags, start_time=now_ms, end_time=0
        )

    def _replace(self, rec: TrialRecord, launch_tags: dict[str, str], now_ms: int) -> TrialRecord:
        from mlflow.entities import Param as MlflowParam
        from mlflow.entities import RunTag

        tags = rec.tags | launch_tags
        run = self.client.create_run(
            self.experiment_id(), start_time=now_ms, tags=tags, run_name=rec.name or None
        )
        run_id = run.info.run_id
        self.set_status(run_id, Status.SCHEDULED)  # RUNNING once the job runs
        items = [MlflowParam(k, v) for k, v in rec.params.items()]
        batches = [items[i : i + 100] for i in range(0, len(items), 100)] or [[]]
        for batch in batches[:-1]:
            self.client.log_batch(run_id, params=batch)
        # last, with the final params: a run tagged started is a whole copy (records()
        # prefers it to the placeholder, should this driver stop before the delete)
        started = _start_tags(rec, now_ms)
        self.client.log_batch(
            run_id, params=batches[-1], tags=[RunTag(k, v) for k, v in started.items()]
        )
        self.client.delete_run(rec.run_id)
        # what was just written (a cancel that comes to this run later is the cancel poll's)
        return TrialRecord(
            run_id=run_id, trial_id=rec.trial_id, status=Status.SCHEDULED,
            tags=tags | started,
            params=dict(rec.params), start_time=now_ms, name=rec.name,
            artifact_uri=run.info.artifact_uri or "",
        )  # fmt: skip

    def _cancelled_placeholders(
        self, placeholders: list[TrialRecord], started: list[TrialRecord]
    ) -> list[TrialRecord]:
        """The started runs whose (now deleted) placeholder carries a cancel: read after
        the deletes, so a cancel written before a delete is seen here, and one written
        after it fails or finds the placeholder deleted and goes to the new run."""
        from mlflow.entities import ViewType

        new_of = {old.run_id: new for old, new in zip(placeholders, started, strict=True)}
        already = [old.run_id for old in placeholders if old.cancelled]
        ids = [run_id for run_id in new_of if run_id not in already]
        for i in range(0, len(ids), 100):
            chunk = ", ".join(f"'{r}'" for r in ids[i : i + 100])
            where = f"attributes.run_id IN ({chunk}) and {tag_filter(Tag.CANCEL, '1')}"
            runs = self.client.search_runs(
                [self.experiment_id()], where, run_view_type=ViewType.ALL, max_results=1000
            )
            already += [run.info.run_id for run in runs]
        return [new_of[run_id] for run_id in already if not new_of[run_id].cancelled]

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
        runs = self.search(cancelled_filter(self.sweep), self.poll_client)
        return {r.info.run_id for r in runs}
