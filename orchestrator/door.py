"""The one door into the orchestrator (docs/architecture.md, 'Data flow of one sweep').

    load(path, overrides)   -> Sweep       read, validate, expand and check every trial
    recorded(name)          -> Sweep       the same, from the YAML and overrides in MLflow
    plan(sweep)             -> SweepPlan   each trial's cost, data and state; what stops a submit
    run(sweep, ...)         -> SweepRun    drive every live trial to its end (blocking)
    detach(sweep, ...)      -> Detached    the same as a Ray job, returning at once
    status / cancel / migrate / find / read / trial
                                           a recorded sweep, by name or YAML file
                                           (orchestrator/recorded_sweep.py)
    sweeps()                -> [SweepSummary]  every recorded sweep, its trials by status
    evaluate(trial, tasks, ...) -> EvalAnswer  a trained trial on lm-eval tasks, scores on
                                           its run (orchestrator/trial_eval.py; score_text
                                           and ran_text write a run's scores as it prints)

The CLI (`cli/sweeps.py`, `cli/watch.py`) and the notebook API (`scalelab`) call these and
render what they return; the order of the steps is decided here only. `run` and `detach`
refuse what `plan` refuses, so a dry-run and a submit run the same checks. Torch-free.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from scalelab.contract.runs import Status
from scalelab.jobs.launch import DEFAULT_JOB, JobRef
from scalelab.orchestrator.backends import BackendError

# What the CLI, the results side and the notebook API read of the orchestrator besides the
# calls below: every caller outside the orchestrator imports this module only
# (tests/test_layers.py).
from scalelab.orchestrator.delivery import send_owed, trained_elsewhere
from scalelab.orchestrator.ledger import Ledger, LedgerUnavailable
from scalelab.orchestrator.ledger.parent import read_long_tag
from scalelab.orchestrator.ledger.records import record_of
from scalelab.orchestrator.migrate import MigrationRefused
from scalelab.orchestrator.plan.branching import ran_line
from scalelab.orchestrator.plan.cpu_rate import cpu_rate
from scalelab.orchestrator.plan.expand import Trial, check_size, gpu_hours
from scalelab.orchestrator.plan.job_checks import Missing, check_trials
from scalelab.orchestrator.plan.planner import (
    PLAN_COLUMNS,
)
from scalelab.orchestrator.plan.spec import (
    DEFAULT_GPU,
    DEFAULT_MAX_TRIALS,
    EstimateConfig,
    SourceMap,
    SpecError,
    SweepSpec,
    load_spec,
    load_yaml,
    located_errors,
    parse_spec,
    read_sweep,
)
from scalelab.orchestrator.plan.trial_names import run_names, short_count, short_value
from scalelab.orchestrator.plan.tuning import expand_sweep as expand
from scalelab.orchestrator.plan.tuning import search_loss, search_plan_line, tuning_text
from scalelab.orchestrator.recorded_sweep import (
    Cancelled,
    Migrated,
    SweepStatus,
    SweepSummary,
    cancel,
    find,
    migrate,
    read,
    status,
    sweeps,
    trial,
)
from scalelab.orchestrator.submitting import being_submitted, submitting
from scalelab.orchestrator.sweep_plan import PlannedTrial, SweepPlan, missing_refusal, plan
from scalelab.orchestrator.trial_eval import (
    EvalAnswer,
    EvalError,
    EvalOptions,
    check_tasks,
    evaluate,
    ran_text,
    score_text,
    scored_names,
)
from scalelab.orchestrator.trial_select import located_trial
from scalelab.orchestrator.trial_status import Failure

if TYPE_CHECKING:
    from scalelab.orchestrator.scheduler import SweepOutcome

__all__ = [
    "PlannedTrial",
    "DEFAULT_GPU",
    "EstimateConfig",
    "Failure",
    "Ledger",
    "MigrationRefused",
    "Trial",
    "cpu_rate",
    "expand",
    "gpu_hours",
    "load_spec",
    "load_yaml",
    "located_errors",
    "located_trial",
    "parse_spec",
    "read_long_tag",
    "read_sweep",
    "record_of",
    "search_plan_line",
    "run_names",
    "send_owed",
    "short_count",
    "short_value",
    "SweepSpec",
    "being_submitted",
    "submitting",
    "EvalAnswer",
    "EvalError",
    "EvalOptions",
    "check_tasks",
    "evaluate",
    "ran_text",
    "score_text",
    "scored_names",
    "Cancelled",
    "Migrated",
    "SweepStatus",
    "SweepSummary",
    "sweeps",
    "trial",
    "DEFAULT_JOB",
    "DEFAULT_MAX_TRIALS",
    "PLAN_COLUMNS",
    "BackendError",
    "LedgerUnavailable",
    "SpecError",
    "Sweep",
    "SweepPlan",
    "SweepRefused",
    "SweepRun",
    "SweepStopped",
    "Watcher",
    "cancel",
    "detach",
    "find",
    "load",
    "migrate",
    "plan",
    "read",
    "recorded",
    "refuse_missing",
    "run",
    "schema",
    "status",
]

# (sweep name, combinations looked at, combinations in all): at 0 before expanding, then
# every few thousand (orchestrator/plan/expand.py)
Progress = Callable[[str, int, int], None]


class SweepRefused(RuntimeError):
    """Nothing was submitted; the message says why and what to do."""


class SweepStopped(RuntimeError):
    """The tracking store failed while the sweep ran: the driver stopped. What MLflow holds
    is the state a later submit of the same sweep resumes from."""


@dataclass(frozen=True)
class Sweep:
    """A validated sweep: its spec and trials (smallest compute first), with what `resume`
    needs to read it again (the YAML's text, its path, the command line's overrides)."""

    spec: SweepSpec
    trials: tuple[Trial, ...]
    text: str
    path: str  # absolute; "" for a sweep read back from MLflow whose file is gone
    overrides: tuple[str, ...] = ()
    max_trials: int = DEFAULT_MAX_TRIALS
    notes: tuple[str, ...] = ()  # what the caller should be told (where the YAML came from)
    missing: tuple[Missing, ...] = ()  # data it reads that is not here (a blocker of `plan`)

    @property
    def name(self) -> str:
        return self.spec.name


def load(
    path: str | Path,
    overrides: list[str] | tuple[str, ...] = (),
    max_trials: int = DEFAULT_MAX_TRIALS,
    progress: Progress | None = None,
) -> Sweep:
    """Read, validate, expand and check a sweep file; bad input raises SpecError (every
    problem, each with file, line and key)."""
    text = read_sweep(path)
    spec, source = parse_spec(text, str(path), list(overrides))
    trials, missing = _expanded(spec, source, max_trials, progress)
    resolved = str(Path(path).resolve())
    return Sweep(spec, tuple(trials), text, resolved, tuple(overrides), max_trials, (), missing)


def recorded(
    name: str,
    max_trials: int = DEFAULT_MAX_TRIALS,
    progress: Progress | None = None,
    more_overrides: tuple[str, ...] = (),
) -> Sweep:
    """A submitted sweep as its parent run recorded it at its last submit (its YAML and
    overrides, whatever their length, then `more_overrides`), validated and expanded again.
    A sweep recorded before its YAML always was (by an older scalelab, over 8,000
    characters) is read from the file at its recorded path, and `notes` says so."""
    from scalelab.orchestrator.ledger.parent import RecordDamaged

    try:
        record = find(name).recorded_spec()
    except RecordDamaged as e:
        raise SweepRefused(str(e)) from None
    text, path, notes = record.yaml, record.path, ()
    if text is None:
        if not path or not Path(path).exists():
            raise SweepRefused(f"sweep {name}: its YAML is not recorded; submit the file again")
        text = read_sweep(path)
        notes = (f"sweep {name}: its YAML was not recorded; read from {path} as it is now",)
    overrides = (*record.overrides, *more_overrides)
    spec, source = parse_spec(text, path or "<recorded sweep>", list(overrides))
    trials, missing = _expanded(spec, source, max_trials, progress)
    return Sweep(spec, tuple(trials), text, path, overrides, max_trials, notes, missing)


def _expanded(
    spec: SweepSpec, source: SourceMap, max_trials: int, progress: Progress | None
) -> tuple[list[Trial], tuple[Missing, ...]]:
    tick = None
    if progress is not None:
        check_size(spec, source, max_trials)  # before announcing anything
        total = spec.combinations
        progress(spec.name, 0, total)
        tick = lambda n: progress(spec.name, n, total)  # noqa: E731
    trials = expand(spec, source, max_trials, tick)
    return trials, check_trials(spec, trials, source)


def refuse_missing(sweep: Sweep) -> None:
    """SweepRefused when the sweep's `storage:` cannot be used or data it reads is not
    here: what `plan` refuses first, known without planning (a submit says it before
    showing any progress)."""
    from scalelab.orchestrator.storage_check import storage_refusal

    storage = storage_refusal(sweep.spec.storage)
    if storage:
        raise SweepRefused(f"sweep {sweep.name}: {storage} (nothing submitted)")
    if sweep.missing:
        raise SweepRefused(missing_refusal(sweep.name, tuple(m.line for m in sweep.missing)))


def _refuse_what_plan_refuses(sweep: Sweep, ignore_fit: bool) -> None:
    """A submit (run or detach) runs the dry-run's checks: SweepRefused when `plan` says no.
    A tracking store the trials cannot write is refused before `plan` opens it: a server on
    this machine's loopback address need not even be up for that."""
    from scalelab.contract.workdir import tracking_uri
    from scalelab.orchestrator.tracking_store import tracking_refusal

    tracking = tracking_refusal(sweep.spec.backend, tracking_uri())
    if tracking:
        raise SweepRefused(f"sweep {sweep.name}: {tracking} (nothing submitted)")
    why = plan(sweep).refusal(ignore_fit)
    if why:
        raise SweepRefused(why)


class Watcher(Protocol):
    """What a caller of `run` hears while the sweep runs (the CLI's progress bar and lines,
    the live figure on the parent run)."""

    def started(
        self, ledger: Ledger, trials: list[Trial], finished: set[str], reused: set[str]
    ) -> None:
        """The sweep is recorded and `trials` are to run (a sweep with `tune:`: the
        search's, then all of them); `finished`: trial ids already FINISHED (skipped);
        `reused`: trial ids another sweep trained, whose curves are copied, not trained."""

    def update(self, counts: dict[str, int]) -> None:
        """Counts by state ('done', 'running', ...), at every scheduler tick."""

    def trial_ended(self, trial_id: str, outcome: str) -> None:
        """A trial this driver ran ended: finished, failed, diverged or killed."""


@dataclass(frozen=True)
class SweepRun:
    sweep: Sweep
    outcome: SweepOutcome  # trial ids by what happened to them here
    failures: tuple[Failure, ...]  # the failed trials as MLflow recorded them
    branching: str | None = None  # what cooldown branches saved (orchestrator/plan/branching.py)
    tuning: str | None = None  # each variant's tuned rate and the checks on it (plan/tuning.py)

    @property
    def ok(self) -> bool:
        return not self.outcome.failed


def run(
    sweep: Sweep,
    *,
    job: JobRef = DEFAULT_JOB,
    ignore_fit: bool = False,
    watcher: Watcher | None = None,
    trained_only: bool = False,
) -> SweepRun:
    """Record the sweep in MLflow and run every trial that is not FINISHED, to its end
    (retries, requeues, cancels); `trained_only`: only the FINISHED trials' owed
    `eval.downstream` steps (`scalelab eval SWEEP`), nothing trained. Refuses (SweepRefused) what `plan` refuses and a backend
    that cannot run it; an unreachable tracking store raises LedgerUnavailable before
    anything is created, and SweepStopped when it fails mid-sweep."""
    from scalelab.orchestrator.backends import preflight
    from scalelab.orchestrator.scheduler import run_sweep
    from scalelab.orchestrator.trial_status import failures
    from scalelab.orchestrator.tuned_run import run_tuned

    _refuse_what_plan_refuses(sweep, ignore_fit)
    spec = sweep.spec
    try:
        preflight(spec.backend)
    except BackendError as e:
        raise SweepRefused(f"{e}; nothing submitted") from None
    ledger = Ledger(spec.name, spec.experiment_name)

    def run_stage(trials: list[Trial], close: bool) -> SweepOutcome:
        if watcher is not None:
            records = ledger.records()
            finished = {tid for tid, rec in records.items() if rec.status == Status.FINISHED}
            reused = trained_elsewhere(trials, records, finished)
            watcher.started(ledger, trials, finished, reused)
        return run_sweep(
            spec, trials, ledger, job=job,
            on_update=watcher.update if watcher else None,
            on_trial=watcher.trial_ended if watcher else None,
            spec_yaml=sweep.text, spec_path=sweep.path, overrides=sweep.overrides,
            trained_only=trained_only, close=close,
        )  # fmt: skip

    try:
        if spec.tune is None or trained_only:
            trials, outcome = list(sweep.trials), run_stage(list(sweep.trials), True)
        else:
            again = lambda: _expanded(spec, SourceMap(sweep.path, None), sweep.max_trials, None)[0]  # noqa: E731
            trials, outcome = run_tuned(list(sweep.trials), ledger, run_stage, again)
            sweep = replace(sweep, trials=tuple(trials))
    except LedgerUnavailable as e:  # mid-sweep: what MLflow holds is the state to resume
        raise SweepStopped(str(e)) from None
    return SweepRun(
        sweep, outcome, tuple(failures(ledger, outcome.failed)), ran_line(sweep.trials),
        tuning_text(sweep.spec, trials, search_loss),
    )  # fmt: skip


@dataclass(frozen=True)
class Detached:
    sweep: Sweep
    job_id: str  # the Ray job's submission id
    address: str  # the Ray dashboard it was submitted to


def detach(sweep: Sweep, *, job: str = DEFAULT_JOB, ignore_fit: bool = False) -> Detached:
    """`run`, as a Ray job on a head on this machine (started if none): returns at once.
    Refuses what `plan` refuses."""
    from scalelab.orchestrator.detach import submit_detached

    _refuse_what_plan_refuses(sweep, ignore_fit)
    if not sweep.path:
        raise SweepRefused(f"sweep {sweep.name}: detaching needs its YAML file")
    try:
        job_id, address = submit_detached(
            Path(sweep.path), job, sweep.max_trials, list(sweep.overrides)
        )
    except RuntimeError as e:
        raise BackendError(str(e)) from None
    return Detached(sweep, job_id, address)


def schema() -> dict[str, Any]:
    """The sweep YAML's JSON Schema (for editors: yaml-language-server)."""
    return SweepSpec.model_json_schema()
