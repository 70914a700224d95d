"""A recorded sweep, by name or YAML file, after its submit: find its ledger, read its state
without building MLflow's client, each trial's status, one trial by run name or id, cancel,
migrate; and the list of recorded sweeps. Re-exported by the door (orchestrator/door.py), which callers use."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scalelab.contract import workdir
from scalelab.contract.runs import TERMINAL
from scalelab.contract.trial_time import shown_status
from scalelab.orchestrator.ledger import Ledger, TrialRecord, find_sweep
from scalelab.orchestrator.plan.spec import load_spec

if TYPE_CHECKING:
    from scalelab.orchestrator.ledger.view import SweepReads
    from scalelab.orchestrator.migrate import MigrationReport


def find(sweep: str) -> Ledger:
    """A recorded sweep's ledger, by name or by its YAML file; LookupError when there is no
    such sweep."""
    if sweep.endswith((".yaml", ".yml")) and Path(sweep).exists():
        spec, _ = load_spec(sweep)
        sweep = spec.name
    try:
        return find_sweep(sweep)
    except LookupError as e:
        if not str(e).startswith("no sweep named"):
            raise
        from scalelab.orchestrator.ledger.view import unknown_sweep

        raise LookupError(unknown_sweep(sweep, workdir.tracking_uri())) from None


def read(sweep: str) -> SweepReads:
    """A recorded sweep's state, read only, by name or YAML file (LookupError when there is
    none): on the default sqlite store without building MLflow's client
    (orchestrator/ledger/view.py)."""
    from scalelab.orchestrator.ledger.view import read_sweep

    if sweep.endswith((".yaml", ".yml")) and Path(sweep).exists():
        spec, _ = load_spec(sweep)
        sweep = spec.name
    return read_sweep(sweep)


@dataclass(frozen=True)
class SweepStatus:
    sweep: str
    experiment: str
    trials: list[dict[str, Any]]  # a row per trial (orchestrator/trial_status.py)


def status(sweep: str, trials: list[str] | None = None) -> SweepStatus:
    """Each trial's state (or the given ones', by run name or id: UnknownTrial when one
    names no trial or several), after sending what finished trials still hold spooled."""
    from scalelab.orchestrator.trial_select import select_all
    from scalelab.orchestrator.trial_status import trial_rows

    ledger = read(sweep)
    rows = trial_rows(ledger)
    if trials:
        chosen = set(select_all({r["trial_id"]: r["name"] for r in rows}, trials, ledger.sweep))
        rows = [r for r in rows if r["trial_id"] in chosen]
    return SweepStatus(ledger.sweep, ledger.experiment, rows)


@dataclass(frozen=True)
class SweepSummary:
    sweep: str
    experiment: str
    counts: dict[str, int]  # its trials by status (FINISHED, FAILED, RUNNING, ...)


def sweeps() -> list[SweepSummary]:
    """Every sweep recorded in the tracking store, by name, with its trials counted by
    status (each trial's latest run, as `status` shows it: STARTING too); read only, on
    the default sqlite store without building MLflow's client."""
    from scalelab.orchestrator.ledger.view import read_sweep, sweep_names

    found = []
    for name in sweep_names():
        view = read_sweep(name)
        counts = Counter(
            shown_status(r.status, r.tags, r.end_time) for r in view.records().values()
        )
        found.append(SweepSummary(name, view.experiment, dict(counts)))
    return found


def trial(ledger: Ledger | SweepReads, selector: str) -> TrialRecord:
    """One trial of a found (or read) sweep, by run name or id (a unique prefix will do); an
    UnknownTrial (a LookupError) says which trials come close."""
    from scalelab.orchestrator.trial_select import select

    records = ledger.records()
    return records[select({r.trial_id: r.name for r in records.values()}, selector, ledger.sweep)]


@dataclass(frozen=True)
class Cancelled:
    sweep: str
    run_ids: list[str]  # the runs marked cancelled
    slurm_jobs: list[str]  # SLURM jobs asked to stop (scancel)


def cancel(sweep: str, trials: list[str] | None = None) -> Cancelled:
    """Cancel a sweep's live trials (or the given ones, by run name or id): SCHEDULED ones
    at once, running ones by their driver within seconds; their SLURM jobs are scancelled."""
    from scalelab.orchestrator.backends.slurm import cancel_jobs, slurm_job_ids
    from scalelab.orchestrator.trial_select import select_all

    recorded = read(sweep)  # nothing live to cancel: no MLflow client to build
    trial_ids = None
    if trials:
        names = {r.trial_id: r.name for r in recorded.records().values()}
        trial_ids = select_all(names, trials, recorded.sweep)
    if not any(
        r.status not in TERMINAL and (not trial_ids or r.trial_id in trial_ids)
        for r in recorded.records().values()
    ):
        return Cancelled(recorded.sweep, [], [])
    ledger = find(sweep)
    touched = ledger.request_cancel(trial_ids)
    jobs = slurm_job_ids(r for r in ledger.records().values() if r.run_id in touched)
    cancel_jobs(jobs)
    return Cancelled(ledger.sweep, touched, jobs)


@dataclass(frozen=True)
class Migrated:
    sweep: str
    report: MigrationReport


def migrate(sweep: str, dry_run: bool = False) -> Migrated:
    """Re-key the trials a sweep recorded under an older identity rule (MigrationRefused
    while one of its drivers is alive or a trial runs)."""
    from scalelab.orchestrator.migrate import migrate_sweep

    ledger = find(sweep)
    return Migrated(ledger.sweep, migrate_sweep(ledger, dry_run=dry_run))
