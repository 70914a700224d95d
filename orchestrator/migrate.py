"""`scalelab migrate SWEEP`: re-key the trials a sweep recorded under an older identity rule
(docs/architecture.md, 'Trial identity'), so an upgrade keeps its finished trials.

For each trial run: its recorded config (trials/<id>/job.json, else the run's params) gives
the id under today's rule. If the recorded id is that id, only the rule tag is added. If it
is the id of rule 1 (the whole science dump), the trial is re-keyed: its folder renamed,
result.json and identity.json written, and last the run's tags (trial id, previous id, run
name, rule), so a migration that stops half-way is completed by running it again. Two old
trials that are one trial under the new rule (they differed in cadence only) keep the
better run; the other is marked superseded. Refuses while a driver of the sweep is alive or
a trial runs.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scalelab.contract import workdir
from scalelab.contract.runs import Param, Role, Status, Tag, trial_run_name
from scalelab.jobs import identity
from scalelab.jobs.config import JobConfig, load_recorded
from scalelab.jobs.tracking.provenance import code_version, unflatten
from scalelab.orchestrator.delivery import send_owed
from scalelab.orchestrator.ledger import Ledger, TrialRecord
from scalelab.orchestrator.ledger.claims import Liveness

UNMATCHED = "unmatched"  # the rule tag of a run whose id neither rule reproduces
_RANK = {Status.FINISHED: 0, Status.RUNNING: 1, Status.FAILED: 2, Status.KILLED: 2}


class MigrationRefused(RuntimeError):
    """The sweep cannot be migrated now (one line: why, and what to do)."""


@dataclass
class MigrationReport:
    rekeyed: dict[str, str] = field(default_factory=dict)  # old id -> new id
    tagged: list[str] = field(default_factory=list)  # id unchanged, rule tag added
    current: list[str] = field(default_factory=list)  # recorded under today's rule already
    unmatched: list[str] = field(default_factory=list)  # neither rule gives the recorded id
    owing: list[str] = field(default_factory=list)  # spooled metrics not deliverable now
    superseded: dict[str, str] = field(default_factory=dict)  # old id -> the id that won

    @property
    def changed(self) -> bool:
        return bool(self.rekeyed or self.tagged or self.superseded)


def needs_migration(ledger: Ledger, records: dict[str, TrialRecord] | None = None) -> int:
    """How many trial runs of the sweep carry no identity rule tag (recorded before rule 2);
    `records`: the ledger's, when just read."""
    records = ledger.records() if records is None else records
    return sum(Tag.IDENTITY_RULE not in rec.tags for rec in records.values())


def migrate_sweep(ledger: Ledger, dry_run: bool = False) -> MigrationReport:
    if ledger.find_parent() is None:
        raise MigrationRefused(f"no sweep named {ledger.sweep!r} in {ledger.uri}")
    drivers = _live_drivers(ledger)
    if drivers:
        raise MigrationRefused(
            f"sweep {ledger.sweep} has a live driver ({drivers[0]}); wait for it to end "
            "or cancel it, then migrate"
        )
    records = list(ledger.records().values())
    running = [r.trial_id for r in records if r.status == Status.RUNNING]
    if running:
        raise MigrationRefused(
            f"sweep {ledger.sweep} has {len(running)} RUNNING trials ({running[0]} ...); "
            "migrate when none runs"
        )
    report = MigrationReport()
    todo: dict[str, list[tuple[TrialRecord, JobConfig, int]]] = {}
    for rec in records:
        rule = rec.tags.get(Tag.IDENTITY_RULE)
        if rule == identity.IDENTITY_RULE:
            report.current.append(rec.trial_id)
            continue
        job, semantics = _recorded(rec)
        new = identity.trial_id(job, semantics)
        if new == rec.trial_id or (
            rule != UNMATCHED and identity.legacy_trial_id(job, semantics) == rec.trial_id
        ):
            todo.setdefault(new, []).append((rec, job, semantics))
        else:
            report.unmatched.append(rec.trial_id)
            if not dry_run:
                ledger.set_tags(rec.run_id, {Tag.IDENTITY_RULE: UNMATCHED})
    if not dry_run:
        _, owed = send_owed([rec for group in todo.values() for rec, _, _ in group], ledger.uri)
        report.owing = [o.trial_id for o in owed]
    taken = {r.trial_id for r in records if r.tags.get(Tag.IDENTITY_RULE) == identity.IDENTITY_RULE}
    for new, group in todo.items():
        group.sort(key=lambda item: (_RANK.get(item[0].status, 3), item[0].start_time))
        (winner, job, semantics), losers = group[0], group[1:]
        if new in taken and winner.trial_id != new:  # a current run holds the new id already
            losers, winner = group, None
        for rec, _, _ in losers:
            report.superseded[rec.trial_id] = new
            if not dry_run:
                ledger.set_tags(rec.run_id, {Tag.ROLE: Role.SUPERSEDED, Tag.SUPERSEDED_BY: new})
        if winner is None or winner.trial_id in report.owing:
            continue
        if winner.trial_id == new:
            report.tagged.append(new)
        else:
            report.rekeyed[winner.trial_id] = new
        if not dry_run:
            _rekey(ledger, winner, identity.identity_tree(job, semantics), new)
    return report


def _live_drivers(ledger: Ledger) -> list[str]:
    """The sweep's other live drivers, once none is unknown (a driver on another host whose
    beat this process has not watched for a lease yet: orchestrator/ledger/claims.py)."""
    while True:
        live = ledger.live_drivers(ledger.parent_tags())
        if all(state is Liveness.ALIVE for state in live.values()):
            return list(live)
        time.sleep(min(ledger.lease_s / 4, 5.0))


def _recorded(rec: TrialRecord) -> tuple[JobConfig, int]:
    """The trial's config as it ran, and the semantics version of the code that ran it."""
    path = workdir.trial_dir(rec.trial_id) / workdir.JOB_FILE
    if path.exists():
        recorded: dict[str, Any] = json.loads(path.read_text())
    else:
        params = unflatten(rec.params)
        recorded = {
            k: params[k] for k in ("model", "data", "train", "deepspeed", "seed") if k in params
        }
    version = rec.tags.get(Tag.CODE_VERSION, "").partition("+")[0].removeprefix("semantics")
    return load_recorded(recorded), int(version) if version.isdigit() else 1


def _rekey(ledger: Ledger, rec: TrialRecord, tree: dict[str, Any], new: str) -> None:
    """Each step idempotent; the MLflow tags last (a rerun then finds the old id and redoes
    the file steps, or the new one and nothing to do)."""
    old_dir, new_dir = workdir.trial_dir(rec.trial_id), workdir.trial_dir(new)
    if old_dir.exists() and not new_dir.exists():
        os.rename(old_dir, new_dir)
    pre_image = identity.canonical_json(tree)
    if new_dir.exists():
        result = new_dir / workdir.RESULT_FILE
        if result.exists():
            data = json.loads(result.read_text())
            data["trial_id"] = new
            _write(result, json.dumps(data))
        _write(new_dir / workdir.IDENTITY_FILE, pre_image)
    if Param.IDENTITY not in rec.params:
        ledger.client.log_param(rec.run_id, Param.IDENTITY, pre_image)
    tags = {Tag.IDENTITY_RULE: identity.IDENTITY_RULE}
    if new != rec.trial_id:
        variant, size = rec.tags.get(Tag.VARIANT, ""), rec.tags.get(Tag.SIZE, "")
        tags |= {
            Tag.TRIAL_ID: new,
            Tag.TRIAL_ID_PREV: rec.trial_id,
            Tag.RUN_NAME: trial_run_name(variant, size, new),
        }
        _log(ledger.sweep, rec.trial_id, new)
    ledger.set_tags(rec.run_id, tags)


def _write(path: Path, text: str) -> None:
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(text)
    tmp.replace(path)


def _log(sweep: str, old: str, new: str) -> None:
    """One line per re-keyed trial, once: a migration that stopped after writing it and is
    run again does not write it twice."""
    path = workdir.results_dir() / sweep / workdir.MIGRATIONS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        logged = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        if any(entry.get("old") == old and entry.get("new") == new for entry in logged):
            return
    line = {"old": old, "new": new, "time": time.time(), "code_version": code_version()}
    with open(path, "a") as f:
        f.write(json.dumps(line) + "\n")
