"""A sweep's plan before anything runs (`door.plan`): each trial's cost, memory, time, data
and recorded state on the sweep's placement, and what would stop a submit
(docs/architecture.md, 'Data flow of one sweep', step 2). Creates nothing. Torch-free."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scalelab.contract.runs import Status
from scalelab.orchestrator.plan.branching import plan_line
from scalelab.orchestrator.plan.expand import Trial, gpu_hours
from scalelab.orchestrator.plan.planner import (
    Placement,
    TrialPlan,
    placement_summary,
    plan_cells,
    plan_columns,
    plan_sweep,
    unfit_lines,
)
from scalelab.orchestrator.plan.spec import SweepSpec

if TYPE_CHECKING:
    from scalelab.orchestrator.door import Sweep


@dataclass(frozen=True)
class PlannedTrial:
    trial: Trial
    name: str  # the MLflow run name, from the settings its axes vary
    swept: dict[str, Any]
    status: str  # the ledger's, or NEW
    hours: float  # GPU-hours, or CPU-hours (ranks x wall, one core each) on CPU
    hours_unit: str  # "gpu_hours" or "cpu_hours"
    data: str  # ready, partial, not prepared, generated, per trial, missing, error: ...
    tokens_needed: int | None
    tokens_available: int | None
    plan: TrialPlan  # memory, fit, time, checkpoint on the sweep's placement

    @property
    def cells(self) -> list[str]:
        """The plan's numbers as table cells, in PLAN_COLUMNS order."""
        return list(plan_cells(self.plan).values())

    def cells_of(self, columns: tuple[str, ...]) -> list[str]:
        """The plan's cells of `columns` (planner.plan_columns), in their order."""
        cells = plan_cells(self.plan)
        return [cells[c] for c in columns]

    def as_dict(self) -> dict[str, Any]:
        t = self.trial
        return {
            "trial_id": t.trial_id, "name": self.name, "swept": self.swept,
            "variant": t.variant, "size": t.size, "params": t.n_params, "tokens": t.tokens,
            "flops": t.flops, self.hours_unit: self.hours, "status": self.status,
            "data": self.data, "tokens_needed": self.tokens_needed,
            "tokens_available": self.tokens_available, "plan": self.plan.as_dict(),
        }  # fmt: skip


@dataclass(frozen=True)
class SweepPlan:
    sweep: Sweep
    trials: tuple[PlannedTrial, ...]
    placement: str  # GPUs, nodes, ranks, micro-batches: one line
    unfit: tuple[str, ...]  # a line per trial that does not fit its GPUs, with the fix
    prepare: tuple[str, ...]  # `scalelab data prepare` commands the plan's text needs
    unmigrated: int  # trials recorded under an older identity rule
    tracking: str | None = None  # why the trials may not write this tracking store
    storage: str | None = None  # why the trials could not use the sweep's `storage:`
    blockers: tuple[str, ...] = ()  # data that is not here, a located line each
    branching: str | None = None  # wsd cooldown branches: compute spent vs independent runs
    saving: dict[str, Any] | None = None  # the same in numbers (orchestrator/plan/branching.py)

    @property
    def on_cpu(self) -> bool:
        """Its trials run without GPUs: hours are CPU-hours."""
        return any(p.hours_unit == "cpu_hours" for p in self.trials)

    @property
    def plan_columns(self) -> tuple[str, ...]:
        """The table's plan columns: on CPU, without those that mean something on GPUs only."""
        return plan_columns(self.on_cpu)

    @property
    def live(self) -> list[PlannedTrial]:
        """The trials a submit would run (not FINISHED)."""
        return [p for p in self.trials if p.status != Status.FINISHED]

    def refusal(
        self, ignore_fit: bool = False, ignore_tracking: bool = False, ignore_blockers: bool = False
    ) -> str | None:
        """Why a submit of this plan would submit nothing; None when it would run. A dry-run
        shows the trials that do not fit, the tracking store's refusal and the blockers as
        lines of the plan (`ignore_fit`, `ignore_tracking`, `ignore_blockers`); storage the
        trials could not use is refused by both."""
        name = self.sweep.name
        if self.tracking and not ignore_tracking:
            return f"sweep {name}: {self.tracking} (nothing submitted)"
        if self.storage:  # a dry-run too: nothing of the plan could be kept there
            return f"sweep {name}: {self.storage} (nothing submitted)"
        if self.blockers and not ignore_blockers:
            return missing_refusal(name, self.blockers)
        if self.unmigrated:
            return (
                f"sweep {name} has {self.unmigrated} trials recorded under an older identity "
                f"rule; run `scalelab migrate {name}` first (nothing submitted)"
            )
        if self.unfit and not ignore_fit:
            return (
                f"{len(self.unfit)} trial(s) do not fit, nothing submitted ({self.placement}; "
                "--ignore-fit submits them anyway):\n" + "\n".join(self.unfit)
            )
        return None

    def as_dict(self) -> dict[str, Any]:
        trials = [p.as_dict() for p in self.trials]
        return {"sweep": self.sweep.name, "placement": self.placement, "trials": trials,
                "tracking_refused": self.tracking, "storage_refused": self.storage,
                "blockers": list(self.blockers),
                "branching": self.saving}  # fmt: skip


def plan(sweep: Sweep) -> SweepPlan:
    """What a submit would do, creating nothing: each trial's cost, memory and time on the
    sweep's placement, its data, its recorded state; and what would stop the submit."""
    from scalelab.contract.workdir import tracking_uri
    from scalelab.orchestrator.plan.cpu_rate import cpu_rate
    from scalelab.orchestrator.plan.data_plan import data_plan
    from scalelab.orchestrator.plan.trial_names import run_names, swept_settings
    from scalelab.orchestrator.storage_check import storage_refusal
    from scalelab.orchestrator.tracking_store import tracking_refusal

    spec, trials = sweep.spec, list(sweep.trials)
    cpu = cpu_rate(spec)
    plans = plan_sweep(spec, trials, cpu)
    mfu, rate = (cpu.mfu, cpu.flops) if cpu else (spec.estimate.mfu, spec.peak_flops)
    statuses, unmigrated = _recorded_state(spec)
    names, swept = run_names(trials), swept_settings(trials)
    data, prepare = data_plan(trials, {m.source for m in sweep.missing})
    planned = tuple(
        PlannedTrial(
            trial=t,
            name=names[t.trial_id],
            swept=swept[t.trial_id],
            status=statuses.get(t.trial_id, "NEW"),
            hours=gpu_hours(t.flops, mfu, rate),  # the same rule with a CPU rank for a GPU
            hours_unit="cpu_hours" if cpu else "gpu_hours",
            data=d.state,
            tokens_needed=d.tokens_needed,
            tokens_available=d.tokens_available,
            plan=p,
        )  # fmt: skip
        for t, p, d in zip(trials, plans, data, strict=True)
    )
    unfit = tuple(unfit_lines(trials, plans))
    tracking = tracking_refusal(spec.backend, tracking_uri())
    storage = storage_refusal(spec.storage)  # a write, a read and a delete of a marker
    blockers = tuple(m.line for m in sweep.missing)
    line, numbers = plan_line(trials, gpu_hours(1.0, mfu, rate), "CPU" if cpu else "GPU")
    return SweepPlan(
        sweep, planned, placement_summary(spec, Placement.of(spec, cpu)), unfit, tuple(prepare), unmigrated,
        tracking, storage, blockers, line, numbers,
    )  # fmt: skip


def _recorded_state(spec: SweepSpec) -> tuple[dict[str, str], int]:
    """The ledger's statuses and its count of trials under an older identity rule, creating
    nothing (a missing sqlite file: all NEW)."""
    from scalelab.contract.workdir import tracking_uri
    from scalelab.orchestrator.ledger.view import open_sweep
    from scalelab.orchestrator.migrate import needs_migration

    uri = tracking_uri()
    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).exists():
        return {}, 0
    ledger = open_sweep(spec.name, spec.experiment_name, uri)
    records = ledger.records()
    return {tid: rec.status for tid, rec in records.items()}, needs_migration(ledger, records)


def missing_refusal(name: str, blockers: tuple[str, ...]) -> str:
    if len(blockers) == 1:
        return f"{blockers[0]} (nothing submitted)"
    return f"sweep {name}: its data is not here, nothing submitted:\n" + "\n".join(blockers)
