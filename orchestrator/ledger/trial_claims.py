"""Two sweeps listing one trial (the same trial id, so the same folder `trials/<trial_id>/`)
never train it at once (docs/architecture.md, 'Data flow of one sweep', step 3;
docs/reliability.md, 'Metrics are never lost'). Within a sweep a driver claims the sweep's
run of the trial (claims.py); before it trains the trial it also claims the trial itself,
whatever sweeps list it: the param
`scalelab.trial_claim.<trial id>.<n>` = this driver and its sweep's parent run, in the same
tracking store, on a run of the experiment `scalelab-trial-claims` (one of SHARDS runs,
picked by the trial id, so that reading a trial's claims reads a 64th of them). Params
are write-once, so exactly one driver wins epoch n. It lets the trial go when the trial ends
there (the param `scalelab.trial_release.<trial id>.<n>`), and its claim lapses when it is
gone, judged as a sweep claim is, by its heartbeat on its own parent run (claims.py: its pid
on its host, elsewhere a beat unchanged for a lease on the reader's clock); then epoch n + 1
can be claimed. A driver that finds the trial claimed waits and looks again; once the
trial's result.json says it is trained, it copies its curve instead (delivery.adopt).

Why the tracking store rather than a lock file in the trial folder: every driver of every
sweep already meets there; its check-and-set is the store's own (a row in a database, on
sqlite or behind a tracking server), not a file lock or an O_EXCL file on NFS, whose locks
may hold on one node only and whose attribute caching delays a stale lock's mtime
(jobs/training/shared_lock.py); the owner's liveness is the heartbeat every driver writes
already; and it holds where nodes share no trial folder at all (`storage:`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from functools import cached_property
from typing import Any

from scalelab.contract import workdir
from scalelab.contract.runs import (
    TRIAL_CLAIMS_EXPERIMENT,
    ExperimentTag,
    Param,
    Role,
    Tag,
    search_all,
    tag_filter,
)
from scalelab.orchestrator.ledger.claims import Claims

SETTLE_S = 0.5  # as parent.py: from creating a run to seeing it in a search, with margin
SHARDS = 64  # runs holding the claims: the first two hex digits of a trial id, mod 64
NOTE = (
    "Which scalelab driver trains each trial, whatever sweeps list it: the write-once params "
    "scalelab.trial_claim.<trial id>.<n> and scalelab.trial_release.<trial id>.<n>, on one run "
    "per trial id's first two hex digits mod 64. Kept by scalelab; not a sweep."
)


class TrialClaims(Claims):
    """The claims on trials across sweeps (the module's docstring)."""

    def claim_trials(self, trial_ids: Iterable[str]) -> dict[str, str | None]:
        """Try to own the training of each trial: trial id -> None where this driver owns
        it now, else the name of the sweep whose live driver holds it ('' for a claim race
        lost just now). A trial never claimed before costs one write."""
        trial_ids = list(trial_ids)
        if not trial_ids:
            return {}
        runs = self._claims_runs({_shard(tid) for tid in trial_ids})
        params: dict[str, dict[str, str]] = {}  # by run, read once per call
        beats: dict[str, dict[str, str] | None] = {}  # parent run tags, by run
        out: dict[str, str | None] = {}
        for tid in trial_ids:
            run_id = runs[_shard(tid)]
            self._unreleased.pop(tid, None)  # wanted again: what this driver holds, it keeps
            fresh = tid not in self._contended and tid not in self._trial_holds
            if fresh and self._write_claim(run_id, tid, 0):
                out[tid] = None  # the first claim on it ever
                continue
            self._contended.add(tid)
            self._trial_holds.pop(tid, None)  # held still only where the newest claim is this one
            if run_id not in params:
                params[run_id] = self.client.get_run(run_id).data.params
            epoch, owner, released = _newest(params[run_id], tid)
            if owner is not None and not released:
                if owner.get("driver") == self.driver_id:  # still: not taken over
                    self._trial_holds[tid] = epoch
                    out[tid] = None
                    continue
                if self._holder_alive(owner, beats):
                    out[tid] = str(owner.get("sweep", "?"))
                    continue
            if self._write_claim(run_id, tid, epoch + 1):
                out[tid] = None
            else:
                out[tid] = ""  # another driver claimed this epoch first
                if f"{Param.TRIAL_CLAIM_PREFIX}{tid}.{epoch + 1}" not in (
                    self.client.get_run(run_id).data.params
                ):  # the write was refused for another reason: the run was deleted
                    self._claims_run_ids.pop(_shard(tid), None)
        return out

    def release_trial(self, trial_id: str) -> None:
        """This driver is done with the trial (trained, failed for good, cancelled): another
        sweep's driver may claim it at once. One try, so an outage never stalls the
        scheduler: a release the store refuses now is tried again at the next periodic
        heartbeat, and lapses with this driver's heartbeat at the latest (`retire`)."""
        epoch = self._trial_holds.pop(trial_id, None)
        if epoch is None:
            return
        self._contended.add(trial_id)  # claimed again only after a read (its epoch is spent)
        self._unreleased[trial_id] = epoch
        self.send_releases()

    def heartbeat(self, poll: bool = False) -> None:
        super().heartbeat(poll)
        self.send_releases()  # the store answers again: the releases an outage held back

    def send_releases(self) -> None:
        """Write the releases not written yet, each tried once (`poll_client`)."""
        from mlflow.exceptions import MlflowException

        from scalelab.orchestrator.ledger.connection import LedgerUnavailable

        for trial_id, epoch in list(self._unreleased.items()):
            key = f"{Param.TRIAL_RELEASE_PREFIX}{trial_id}.{epoch}"
            try:
                run_id = self._claims_runs({_shard(trial_id)})[_shard(trial_id)]
                self.poll_client.log_param(run_id, key, self.driver_id)
            except LedgerUnavailable:
                return  # the store is down: the rest waits for the next beat too
            except MlflowException:
                pass  # written already, or the claims' run was deleted: nothing to let go
            del self._unreleased[trial_id]

    def _write_claim(self, run_id: str, trial_id: str, epoch: int) -> bool:
        from mlflow.exceptions import MlflowException

        mine = json.dumps({"driver": self.driver_id, "parent": self.parent_id,
                           "sweep": self.sweep})  # fmt: skip
        try:
            self.client.log_param(run_id, f"{Param.TRIAL_CLAIM_PREFIX}{trial_id}.{epoch}", mine)
        except MlflowException:  # another driver claimed this epoch first
            return False
        self._trial_holds[trial_id] = epoch
        return True

    def _holder_alive(self, owner: dict[str, Any], beats: dict[str, dict[str, str] | None]) -> bool:
        """Whether the driver that claimed a trial is not known to be gone (claims.py)."""
        from mlflow.exceptions import MlflowException

        parent = str(owner.get("parent"))
        if parent not in beats:
            try:
                beats[parent] = self.client.get_run(parent).data.tags
            except MlflowException:  # its sweep's parent run is gone: so is its heartbeat
                beats[parent] = None
        tags = beats[parent]
        return tags is not None and self.driver_alive(owner.get("driver"), tags)

    @cached_property
    def _trial_holds(self) -> dict[str, int]:
        """Trial id -> the epoch of its claim this driver holds."""
        return {}

    @cached_property
    def _unreleased(self) -> dict[str, int]:
        """Trial id -> the epoch of a claim let go here whose release the store refused."""
        return {}

    @cached_property
    def _contended(self) -> set[str]:
        """Trials this driver found claimed: read before a claim is written."""
        return set()

    @cached_property
    def _claims_run_ids(self) -> dict[str, str]:
        """Shard (`_shard`) -> its claims' run, as found."""
        return {}

    def _claims_runs(self, shards: set[str]) -> dict[str, str]:
        """The claims' run of each shard. Where one is missing, every missing shard's run is
        made at once (once per tracking store: a second sweep finds them all), then one
        settle, the oldest kept where two drivers made one (as the parent run: parent.py)."""
        from mlflow.exceptions import MlflowException

        known = self._claims_run_ids
        if shards <= known.keys():
            return known
        eid = self._claims_experiment
        found = tag_filter(Tag.ROLE, Role.TRIAL_CLAIMS)
        known.update(_oldest(search_all(self.client, [eid], found)))
        if shards - known.keys():
            missing = {f"{i:02d}" for i in range(SHARDS)} - known.keys()
            mine = {
                self.client.create_run(
                    eid,
                    run_name=f"trial claims {s}",
                    tags={Tag.ROLE: Role.TRIAL_CLAIMS, Tag.SHARD: s},
                ).info.run_id
                for s in sorted(missing)
            }
            time.sleep(SETTLE_S)
            known.update(_oldest(search_all(self.client, [eid], found)))
            for run_id in mine - set(known.values()):  # lost a creation race: the winner's
                try:
                    self.client.delete_run(run_id)
                except MlflowException:
                    pass
        return known

    @cached_property
    def _claims_experiment(self) -> str:
        from mlflow.exceptions import MlflowException

        exp = self.client.get_experiment_by_name(TRIAL_CLAIMS_EXPERIMENT)
        if exp is not None:
            return exp.experiment_id
        location = None if self.uri.startswith("http") else workdir.artifact_root().as_uri()
        try:
            return self.client.create_experiment(TRIAL_CLAIMS_EXPERIMENT, location,
                                                 tags={ExperimentTag.NOTE: NOTE})  # fmt: skip
        except MlflowException:  # another driver created it just now
            return self.client.get_experiment_by_name(TRIAL_CLAIMS_EXPERIMENT).experiment_id


def _shard(trial_id: str) -> str:
    """The label of the run that holds the trial's claims."""
    return f"{int(trial_id[:2], 16) % SHARDS:02d}"


def _oldest(runs: list[Any]) -> dict[str, str]:
    """Shard -> its oldest claims' run."""
    out: dict[str, tuple[int, str]] = {}
    for run in runs:
        shard = run.data.tags.get(Tag.SHARD)
        key = (run.info.start_time, run.info.run_id)
        if shard and (shard not in out or key < out[shard]):
            out[shard] = key
    return {shard: run_id for shard, (_, run_id) in out.items()}


def _newest(params: dict[str, str], trial_id: str) -> tuple[int, dict[str, Any] | None, bool]:
    """A trial's newest claim epoch (-1: none), who claimed it, and whether it was let go."""
    prefix = f"{Param.TRIAL_CLAIM_PREFIX}{trial_id}."
    epochs = [int(k[len(prefix) :]) for k in params if k.startswith(prefix)
              and k[len(prefix) :].isdigit()]  # fmt: skip
    if not epochs:
        return -1, None, False
    epoch = max(epochs)
    try:
        owner = json.loads(params[f"{prefix}{epoch}"])
    except ValueError:
        owner = None
    released = f"{Param.TRIAL_RELEASE_PREFIX}{trial_id}.{epoch}" in params
    return epoch, owner if isinstance(owner, dict) else {}, released
