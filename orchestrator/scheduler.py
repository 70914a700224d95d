"""Drive a sweep: claim each live trial, run it on the backend, record the outcome in MLflow.

Smallest training compute first, so the scaling picture fills in early; at most
`backend.concurrency` trials at once; a trial that another sweep's driver is training
(sweeps listing the same trial share its folder) waits for it, then copies its curve: it
is never trained twice at once (orchestrator/ledger/trial_claims.py); a FAILED attempt is
retried after `retry_backoff_s * 2**(attempt-1)` seconds up to `max_retries` times, then
the trial is FAILED with the error as the `scalelab.error` tag; a trial whose loss diverged is FAILED at
once and tagged `scalelab.diverged` (the same trial diverges again: retrying only burns
compute), and a later submit skips it like one out of retries; a trial its node refused
(no CUDA, too few GPUs: jobs/training/devices.py) is FAILED at once too, tagged
`scalelab.refused`, without using up an attempt, so a submit after the fix runs it; a PREEMPTED trial is requeued under
the same run id without using up a retry (a trial gets its run at its first launch,
`Ledger.start_run`, and keeps it), and so is a trial whose Ray node died under it (a cloud's
spot reclaim: Ray's NodeDiedError), which resumes from its last checkpoint on another node;
`scalelab cancel` is honoured within a poll.
A wsd cooldown branch waits for its trunk's checkpoint (orchestrator/plan/branching.py).
A trial whose training is done (its `result.json`) is never trained again: the driver
only sends what its run still lacks, and marks a run FINISHED only once its spool is
empty (`orchestrator/delivery.py`); a FINISHED trial whose `eval.downstream` scores are
owed (a driver killed during that step, tasks added since) is launched for that step alone,
and its run keeps the status and times of its training.

Why one module: `run_sweep`'s loop and the steps that change its state (claim, launch,
settle, cancel) share that state; the ledger's rooms and the backends hold the rest.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from scalelab.contract import workdir
from scalelab.contract.runs import Status, Tag
from scalelab.contract.trial_time import attempt_end_tags, next_attempt_tags, timestamp_text
from scalelab.jobs.launch import DEFAULT_JOB, JobRef
from scalelab.jobs.tracking.outbox import ENDED_BY_DRIVER, Outbox
from scalelab.orchestrator import delivery
from scalelab.orchestrator.backends import make_backend
from scalelab.orchestrator.ledger import Ledger, LedgerUnavailable, Liveness, TrialRecord
from scalelab.orchestrator.plan import branching
from scalelab.orchestrator.plan.expand import Trial
from scalelab.orchestrator.plan.spec import SweepSpec

MAX_ERROR_LINES = 20


@dataclass
class SweepOutcome:
    """What this driver saw: trial ids by what happened to them."""

    finished: list[str] = field(default_factory=list)  # ran to FINISHED here
    failed: list[str] = field(default_factory=list)  # retries used up, or diverged
    diverged: list[str] = field(default_factory=list)  # of `failed`: the loss diverged
    killed: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # already FINISHED (or out of retries)
    untrained: list[str] = field(default_factory=list)  # not FINISHED, left (trained_only)
    elsewhere: list[str] = field(default_factory=list)  # claimed by another live driver
    reused: list[str] = field(default_factory=list)  # trained under another run: copied
    # trained, but MLflow writes are spooled where this driver cannot send them (a cluster
    # node's folder): left RUNNING, tagged scalelab.outbox_pending
    undelivered: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failed


LOOKS_PER_LEASE = 4  # how often a trial claimed by a driver not known to live is looked at
TRIAL_LOOK_S = 5.0  # how often a trial another sweep's driver trains is looked at (at most)


@dataclass
class _Live:
    trial: Trial
    rec: TrialRecord
    not_before: float = 0.0  # retry backoff
    requeued: bool = False  # preempted: the next launch is not a new attempt
    trained: bool = False  # launched for its eval.downstream step alone (its training is done)
    lost_claims: int = 0  # claims lost to an owner not known to live (a new one each lease)


def _error_text(exc: BaseException) -> str:
    """What a failed attempt records as `scalelab.error`: the job's own exception, not Ray's
    wrapper (`ray::scalelab-trial:<trial id>:<attempt>() (pid=..., ip=...)` and the remote
    traceback). Input errors (ValueError) are their message; anything else is named by its
    type too."""
    from ray.exceptions import RayTaskError

    while isinstance(exc, RayTaskError) and exc.cause is not None and exc.cause is not exc:
        exc = exc.cause
    text = "\n".join(str(exc).strip().splitlines()[:MAX_ERROR_LINES])
    if not text:
        return type(exc).__name__
    return text if isinstance(exc, ValueError) else f"{type(exc).__name__}: {text}"


def run_sweep(
    spec: SweepSpec,
    trials: list[Trial],
    ledger: Ledger,
    *,
    job: JobRef = DEFAULT_JOB,
    poll_s: float = 0.5,
    cancel_poll_s: float = 2.0,
    on_update: Callable[[dict[str, int]], None] | None = None,
    on_trial: Callable[[str, str], None] | None = None,
    spec_yaml: str = "",
    spec_path: str = "",
    overrides: list[str] | tuple[str, ...] = (),
    trained_only: bool = False,
    close: bool = True,
) -> SweepOutcome:
    """Run every live trial of the sweep to a terminal state (or until cancelled).
    `on_update(counts)` follows the counts; `on_trial(trial_id, outcome)` is called once
    per trial this driver ran, when it ends ('finished', 'failed', 'diverged', 'killed').
    `trained_only`: a trial not FINISHED is left as it is (`scalelab eval SWEEP`).
    `close=False`: a stage of the sweep, more trials follow (orchestrator/plan/tuning.py):
    the sweep's run is not ended and this driver's claim is kept."""
    cfg = spec.backend
    out = SweepOutcome()
    records = ledger.sync(
        spec,
        trials,
        spec_yaml=spec_yaml,
        spec_path=spec_path,
        overrides=json.dumps(list(overrides)),
    )
    ledger.heartbeat()
    parent_tags = ledger.parent_tags()

    pending: list[_Live] = []
    for trial in trials:  # already sorted by compute
        rec = records[trial.trial_id]
        if rec.status == Status.FINISHED and not owes_eval(trial, rec):
            out.skipped.append(trial.trial_id)
        elif trained_only and rec.status != Status.FINISHED:
            out.untrained.append(trial.trial_id)
        elif rec.status == Status.KILLED and ledger.driver_alive(rec.claim[1], parent_tags):
            out.elsewhere.append(trial.trial_id)  # cancelled under a driver still running
        elif (
            rec.status == Status.FAILED
            and (rec.attempts > cfg.max_retries or rec.tags.get(Tag.DIVERGED) == "1")
            and not delivery.trained(trial.trial_id)
        ):
            out.skipped.append(trial.trial_id)
        else:
            if rec.cancelled:  # re-submitting a cancelled trial runs it again
                ledger.set_tags(rec.run_id, {Tag.CANCEL: "0"})
                rec.tags[Tag.CANCEL] = "0"
            if rec.tags.get(Tag.REFUSED) == "1":  # refused by its node last time: try again
                ledger.set_tags(rec.run_id, {Tag.REFUSED: "0"})
                rec.tags[Tag.REFUSED] = "0"
            pending.append(_Live(trial, rec))
    # a trial out of retries is not run again, but what its job could not send is (the
    # spool of its last attempt, kept through an outage): as `status` and `sync` do
    spent = [records[tid] for tid in out.skipped if records[tid].status == Status.FAILED]
    delivery.send_owed(spent, ledger.uri)
    if not pending:  # nothing to run: the statuses just read are the sweep's
        if close:
            _close_parent(ledger, out, {tid: rec.status for tid, rec in records.items()})
            ledger.retire()
        return out

    holds = branching.branches(trials)  # wsd cooldown branches wait for their trunk's seed
    backend = make_backend(cfg, ledger, job)  # started at the first launch
    started = False
    sends = delivery.Deliveries(ledger.uri)
    inflight: dict[Any, _Live] = {}
    killing: set[Any] = set()  # handles cancelled on request
    last_beat = last_cancel_check = time.monotonic()
    counts = {"done": len(out.skipped) + len(out.untrained), "running": 0, "total": len(trials)}
    reported: set[str] = set()
    try:
        while pending or inflight or sends:
            now = time.monotonic()
            if now - last_beat > ledger.lease_s / 4:
                try:
                    ledger.heartbeat(poll=True)
                    last_beat = now
                except LedgerUnavailable:  # the store is down: beat again at the next turn
                    pass
            if now - last_cancel_check > cancel_poll_s:
                last_cancel_check = now
                _apply_cancels(ledger, backend, pending, inflight, killing, out)

            free = cfg.concurrency - len(inflight)
            waiting = _waiting(pending, inflight) if holds else set()
            ready = [live for live in pending if live.not_before <= now
                     and _unheld(live, holds, waiting)][: max(free, 0)]  # fmt: skip
            if ready:
                to_train = _adopt_trained(ledger, _claim(ledger, ready, pending, out), sends)
                if to_train:
                    if not started:
                        backend.start()
                        started = True
                        import ray  # only after start(), which imports Ray in single-node mode
                    _launch(ledger, backend, to_train, inflight)
            for tid, run_id in sends.poll():
                ledger.set_status(run_id, Status.FINISHED, clear_error=True)  # spool sent
                trained_in = (delivery.trained(tid) or {}).get("run_id")
                (out.finished if trained_in in (None, run_id) else out.reused).append(tid)
            if not inflight:
                if pending or sends:
                    time.sleep(poll_s)
            else:
                refs = list(inflight)
                done, _ = ray.wait(refs, num_returns=1, timeout=poll_s)
                if done:  # take every result that is ready, not just the first
                    done, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
                for handle in done:
                    live = inflight.pop(handle)
                    retries = -1 if handle in killing else cfg.max_retries
                    _settle(ledger, live, handle, pending, out, retries, cfg.retry_backoff_s, sends)
                    if live not in pending:  # ended here: another sweep may have the trial
                        ledger.release_trial(live.trial.trial_id)
            finished = out.finished + out.reused + out.undelivered
            if on_trial:
                _report_ended(out, finished, reported, on_trial)
            counts.update(
                done=len(out.skipped + out.untrained + finished + out.failed + out.killed),
                running=len(inflight) + len(sends),
            )
            if on_update:
                on_update(counts)
    finally:
        sends.close()
        if started:
            backend.stop()
    if close:
        _close_parent(ledger, out)
        ledger.retire()
    return out


def _waiting(pending: list[_Live], inflight: dict) -> set[str]:
    return {x.trial.trial_id for x in pending} | {x.trial.trial_id for x in inflight.values()}


def _unheld(live: _Live, holds: dict[str, branching.Branch], waiting: set[str]) -> bool:
    """A trial may launch: it is no cooldown branch, or its seed is written (or its own
    checkpoint), or its trunk will not write it here (FINISHED before the branch joined,
    out of retries, run by another driver): then it trains alone, from step 0."""
    branch = holds.get(live.trial.trial_id)
    if branch is None or branching.seeded(workdir.trial_dir(branch.trial_id), branch):
        return True
    return branch.trunk_id not in waiting


def _report_ended(
    out: SweepOutcome, finished: list[str], reported: set[str], on_trial: Callable[[str, str], None]
) -> None:
    ended = [(t, "finished") for t in finished] + [(t, "killed") for t in out.killed]
    ended += [(t, "diverged" if t in out.diverged else "failed") for t in out.failed]
    for tid, outcome in ended:
        if tid not in reported:
            reported.add(tid)
            on_trial(tid, outcome)


def _claim(
    ledger: Ledger, ready: list[_Live], pending: list[_Live], out: SweepOutcome
) -> list[_Live]:
    parent_tags = ledger.parent_tags()
    fresh = ledger.records_of([live.rec.run_id for live in ready])  # others may have moved on
    if any(live.rec.run_id not in fresh for live in ready):  # a placeholder another driver
        by_trial = ledger.records()  # replaced by its first launch's run (a tracking server)
        fresh |= {live.rec.run_id: by_trial[live.trial.trial_id] for live in ready
                  if live.rec.run_id not in fresh and live.trial.trial_id in by_trial}  # fmt: skip
    candidates = []
    for live in ready:
        pending.remove(live)
        live.rec = fresh.get(live.rec.run_id, live.rec)
        if live.rec.status == Status.FINISHED and not owes_eval(live.trial, live.rec):
            out.skipped.append(live.trial.trial_id)
        elif live.rec.cancelled:
            ledger.set_status(live.rec.run_id, Status.KILLED)
            ledger.release_trial(live.trial.trial_id)
            out.killed.append(live.trial.trial_id)
        else:
            candidates.append(live)
    won = ledger.map(lambda live: ledger.claim(live.rec, parent_tags), candidates)
    for live, ok in zip(candidates, won, strict=True):
        if ok:
            continue
        live.lost_claims += 1
        owner_lives = ledger.liveness(live.rec.claim[1], parent_tags) is Liveness.ALIVE
        if owner_lives or live.lost_claims > LOOKS_PER_LEASE * 3:
            out.elsewhere.append(live.trial.trial_id)  # its driver runs it (a resubmit looks again)
        else:  # an owner not watched for a lease yet, or a claim race: look again soon
            live.not_before = time.monotonic() + ledger.lease_s / LOOKS_PER_LEASE
            pending.append(live)
    return _claim_trials(ledger, [live for live, ok in zip(candidates, won, strict=True) if ok],
                         pending)  # fmt: skip


def _claim_trials(ledger: Ledger, claimed: list[_Live], pending: list[_Live]) -> list[_Live]:
    """Of the trials this driver owns in its sweep, those it may launch now: the trained
    ones (copied or evaluated, never trained again: `_adopt_trained`) and those whose
    training it claims across sweeps. A trial another sweep's live driver is training
    waits, its run tagged `scalelab.waiting_for` = that sweep, and is looked at again until
    that driver lets it go (trained: its curve is copied) or is gone (its claim lapses:
    trained here, resumed from its checkpoint)."""
    untrained = [
        live.trial.trial_id for live in claimed if not delivery.trained(live.trial.trial_id)
    ]
    holders = ledger.claim_trials(untrained)
    look = min(TRIAL_LOOK_S, ledger.lease_s / LOOKS_PER_LEASE)
    free = []
    for live in claimed:
        holder, waiting = holders.get(live.trial.trial_id), live.rec.tags.get(Tag.WAITING_FOR)
        if holder is None:
            if waiting is not None:  # its wait is over
                ledger.client.delete_tag(live.rec.run_id, Tag.WAITING_FOR)
                del live.rec.tags[Tag.WAITING_FOR]
            free.append(live)
            continue
        if holder and waiting != f"sweep {holder}":
            ledger.set_tags(live.rec.run_id, {Tag.WAITING_FOR: f"sweep {holder}"})
            live.rec.tags[Tag.WAITING_FOR] = f"sweep {holder}"
        live.not_before = time.monotonic() + look
        pending.append(live)
    return free


def _adopt_trained(ledger: Ledger, claimed: list[_Live], sends: delivery.Deliveries) -> list[_Live]:
    """The claimed trials to launch. Those whose training is done (their result.json) are
    never trained again: their runs are only sent what they lack, or, when their
    `eval.downstream` scores are owed, they are launched for that step alone (jobs/launch.py),
    which is not a new attempt."""
    to_train = []
    for live in claimed:
        if not delivery.trained(live.trial.trial_id):
            to_train.append(live)
            continue
        ledger.release_trial(live.trial.trial_id)  # trained since this driver claimed it
        if owes_eval(live.trial, live.rec):
            live.requeued = live.trained = True
            to_train.append(live)
        else:
            sends.add(live.trial.trial_id, live.rec.run_id, adopt=True)
    return to_train


def owes_eval(trial: Trial, rec: TrialRecord) -> bool:
    """The trial's `eval.downstream` asks for tasks whose scores its run lacks."""
    from scalelab.jobs.downstream.record import owed
    from scalelab.jobs.downstream.tasks import TaskError

    wanted = trial.job.eval.downstream
    if wanted is None:
        return False
    try:
        return bool(owed(list(wanted.tasks), rec.metrics))
    except TaskError:  # a task file gone since submit: the step says so on the run
        return True


def _launch(ledger: Ledger, backend: Any, claimed: list[_Live], inflight: dict) -> None:
    planned = [_planned_tags(backend, live) for live in claimed]
    first = [(live, tags) for live, tags in zip(claimed, planned, strict=True)
             if not live.rec.launched]  # fmt: skip
    launch_ms, firsts = int(time.time() * 1000), {id(live) for live, _ in first}
    started = ledger.start_runs([live.rec for live, _ in first], [tags for _, tags in first])
    for (live, _), rec in zip(first, started, strict=True):
        live.rec = rec  # its run from now on, created as it starts (Ledger.start_runs)
    # a run its driver ended (cancelled, failed) that trains again is opened again first, as
    # a first launch's is: the spool of its job never opens such a run (jobs/tracking/outbox.py)
    again = [live for live in claimed if live.rec.launched and not live.trained
             and live.rec.status in ENDED_BY_DRIVER]  # fmt: skip
    ledger.map(lambda live: ledger.set_status(live.rec.run_id, Status.SCHEDULED), again)
    for live in again:
        live.rec.status = Status.SCHEDULED
    items = [(live.trial, live.rec, tags.get(Tag.JOB_REF))
             for live, tags in zip(claimed, planned, strict=True)]  # fmt: skip
    writes = []
    launched = backend.launch_many(items)
    for live, tags, (handle, job_ref) in zip(claimed, planned, launched, strict=True):
        reattached = False
        if not tags:  # the launch named the job (a SLURM job id)
            reattached = job_ref == live.rec.tags.get(Tag.JOB_REF)  # a SLURM job still alive
            attempt = live.rec.attempts + (0 if reattached or live.requeued else 1)
            tags = {Tag.ATTEMPTS: str(attempt), Tag.JOB_REF: job_ref}
        if id(live) not in firsts and not (live.trained or reattached):  # a later attempt:
            # its launch, and the time of those before it (its run time sums them)
            tags = tags | next_attempt_tags(live.rec.tags, live.rec.end_time, launch_ms)
        live.requeued = False
        # never Tag.CANCEL: a `scalelab cancel` may have landed since the claim
        if any(live.rec.tags.get(k) != v for k, v in tags.items()):
            writes.append((live.rec.run_id, tags))
        live.rec.tags.update(tags)
        inflight[handle] = live
    ledger.map(lambda w: ledger.set_tags(*w), writes)


def _planned_tags(backend: Any, live: _Live) -> dict[str, str]:
    """A launch's tags when its backend names the job before launching it (a Ray task): a
    first launch's run is created with them. {} when the launch names it (SLURM)."""
    attempt = live.rec.attempts + (0 if live.requeued else 1)
    ref = backend.job_ref_ahead(live.trial, attempt)
    return {Tag.ATTEMPTS: str(attempt), Tag.JOB_REF: ref} if ref else {}


def _settle(
    ledger: Ledger,
    live: _Live,
    handle: Any,
    pending: list[_Live],
    out: SweepOutcome,
    max_retries: int,
    backoff_s: float,
    sends: delivery.Deliveries,
) -> None:
    import ray

    run_id, tid = live.rec.run_id, live.trial.trial_id
    try:
        outcome = ray.get(handle)
    except ray.exceptions.TaskCancelledError:
        outcome = {"status": Status.KILLED, "reason": "cancelled"}
    except ray.exceptions.NodeDiedError as e:  # its node was taken away (a spot reclaim)
        outcome = {"status": Status.PREEMPTED, "reason": f"node lost: {e}"}
    except Exception as e:  # the job raised, or its worker died
        outcome = {"status": Status.FAILED, "reason": _error_text(e)}
    status = outcome["status"]
    if max_retries < 0 and status != Status.FINISHED:  # cancelled on request, however it ended
        status = Status.KILLED
    now_ms = int(time.time() * 1000)  # the attempt's end

    def ended(run_status: str) -> dict[str, str]:
        return _attempt_end(live, run_status, now_ms)

    if status == Status.FINISHED and live.trained and live.rec.end_time:
        # evaluated a trial whose run had ended trained: its curve is there and its times are
        # the training's, which an evaluation never moves (docs/evaluation.md, 'In a sweep')
        if live.rec.status != Status.FINISHED or Tag.ERROR in live.rec.tags:  # a failed try
            ledger.set_status(run_id, Status.FINISHED, clear_error=True, end_ms=live.rec.end_time)
        out.finished.append(tid)
    elif status == Status.FINISHED and live.trained:  # evaluated: the run gets what it lacks
        sends.add(tid, run_id, adopt=True)  # of the training (trained in another sweep's run)
    elif status == Status.FINISHED:
        outbox = Outbox(workdir.trial_dir(tid), run_id)
        spooled = outbox.pending() or outcome.get("metrics_pending") or 0
        if not spooled:
            earlier_error = live.rec.attempts > 1 or Tag.ERROR in live.rec.tags
            if tags := ended(Status.FINISHED):
                ledger.set_tags(run_id, tags)
            ledger.set_status(run_id, Status.FINISHED, clear_error=earlier_error, end_ms=now_ms)
            out.finished.append(tid)
        elif outbox.exists():  # MLflow was unreachable when the job ended: send the rest
            sends.add(tid, run_id)
        else:  # spooled in a folder this driver cannot see: the next job there sends it
            ledger.set_tags(run_id, {Tag.OUTBOX_PENDING: str(spooled)})
            out.undelivered.append(tid)
    elif status == Status.PREEMPTED:
        ledger.set_tags(run_id, {Tag.PREEMPTED: timestamp_text(now_ms)} | ended(Status.RUNNING))
        live.not_before, live.requeued = 0.0, True
        pending.insert(0, live)  # same run id, resumes from its checkpoint
    elif status == Status.KILLED:
        if tags := ended(Status.KILLED):
            ledger.set_tags(run_id, tags)
        ledger.set_status(run_id, Status.KILLED, end_ms=now_ms)
        out.killed.append(tid)
    elif outcome.get("refused"):  # the same node and software refuse it again: no retry
        error = f"{outcome.get('reason')} (not retried: fix the nodes' environment, submit again)"
        tags = {Tag.ERROR: error, Tag.REFUSED: "1", Tag.ATTEMPTS: str(live.rec.attempts - 1)}
        ledger.set_tags(run_id, tags | ended(Status.FAILED))
        ledger.set_status(run_id, Status.FAILED, end_ms=now_ms)
        out.failed.append(tid)
    elif outcome.get("diverged"):
        error = str(outcome.get("reason") or "diverged")
        ledger.set_tags(run_id, {Tag.ERROR: error, Tag.DIVERGED: "1"} | ended(Status.FAILED))
        ledger.set_status(run_id, Status.FAILED, end_ms=now_ms)
        out.failed.append(tid)
        out.diverged.append(tid)
    elif live.rec.attempts < max_retries + 1:
        delay = backoff_s * 2 ** (live.rec.attempts - 1)
        error = {Tag.ERROR: str(outcome.get("reason") or "failed")}
        ledger.set_tags(run_id, error | ended(Status.SCHEDULED))
        ledger.set_status(run_id, Status.SCHEDULED)
        live.not_before = time.monotonic() + delay
        pending.append(live)
    else:
        error = {Tag.ERROR: str(outcome.get("reason") or "failed")}
        ledger.set_tags(run_id, error | ended(Status.FAILED))
        ledger.set_status(run_id, Status.FAILED, end_ms=now_ms)
        out.failed.append(tid)


def _attempt_end(live: _Live, run_status: str, now_ms: int) -> dict[str, str]:
    """The tags of an attempt that ended at `now_ms` (contract/trial_time.py), its run then
    `run_status`: its end where its run goes on (a retry, a requeue), where the run's end
    time does not say it; the whole run time of a trial that ran more than once where it
    ends, for MLflow's table. Kept on the live record too, which the next launch reads. An
    evaluation of a trained trial is no attempt: {}."""
    if live.trained:
        return {}
    tags = attempt_end_tags(live.rec.tags, run_status, now_ms)
    live.rec.tags.update(tags)
    return tags


def _apply_cancels(
    ledger: Ledger,
    backend: Any,
    pending: list[_Live],
    inflight: dict,
    killing: set,
    out: SweepOutcome,
) -> None:
    try:
        cancelled = ledger.cancelled_run_ids()
    except LedgerUnavailable:  # the store is down: the next poll asks again
        return
    if not cancelled:
        return
    for live in [p for p in pending if p.rec.run_id in cancelled]:
        pending.remove(live)
        ledger.set_status(live.rec.run_id, Status.KILLED)
        ledger.release_trial(live.trial.trial_id)
        out.killed.append(live.trial.trial_id)
    for handle, live in list(inflight.items()):
        if live.rec.run_id in cancelled and handle not in killing:
            killing.add(handle)
            backend.cancel(handle, live.rec)  # its ObjectRef then settles as KILLED


def close_sweep(ledger: Ledger, out: SweepOutcome) -> None:
    """End a sweep run in stages (`run_sweep(close=False)`) after its last stage."""
    _close_parent(ledger, out)
    ledger.retire()


def _close_parent(
    ledger: Ledger, out: SweepOutcome, statuses: dict[str, str] | None = None
) -> None:
    statuses = statuses if statuses is not None else ledger.statuses()
    if all(s == Status.FINISHED for s in statuses.values()):
        ledger.finish_sweep(Status.FINISHED)
    elif out.elsewhere or any(s in (Status.RUNNING, Status.SCHEDULED) for s in statuses.values()):
        ledger.set_status(ledger.parent_id, Status.RUNNING)
    elif any(s == Status.FAILED for s in statuses.values()):
        ledger.finish_sweep(Status.FAILED)
    else:
        ledger.finish_sweep(Status.KILLED)
