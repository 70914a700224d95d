"""The training job's own checks (jobs/checks.py) on every trial of a sweep, run by
`submit` and `submit --dry-run` before any MLflow run exists.

A sweep whose trials cannot start (a data source that does not exist, a tokenizer larger
than model.vocab_size, a batch that does not split across the backend's ranks, fp16 on
CPU) is refused with one `file:line: key: message` per problem, instead of creating runs
that each fail. The data checks read this machine's files and tokenizer caches: they hold
for the trials when those run here or see the same filesystem (local, SLURM).
"""

from __future__ import annotations

from dataclasses import dataclass

from scalelab.jobs.checks import check_environment, check_placement
from scalelab.jobs.config import JobCheckError, MissingData
from scalelab.orchestrator.plan.expand import MAX_PROBLEMS, Trial, trial_problem
from scalelab.orchestrator.plan.spec import SourceMap, SpecError, SweepSpec


@dataclass(frozen=True)
class Missing:
    """Data a valid sweep reads that is not here: its data.source and the located line
    (`file:line: key: message`) that says so."""

    source: str
    line: str


def check_trials(spec: SweepSpec, trials: list[Trial], source: SourceMap) -> tuple[Missing, ...]:
    """Raise SpecError listing every (distinct) problem; the data checks run once per
    distinct (data, model) pair. Data that is not here (a missing file, a hub dataset
    neither cached nor reachable) is not a problem of the sweep: it is returned, one line
    per place in the file that names it (orchestrator/plan/data_availability.py checks the hub
    datasets, all at once and bounded in time)."""
    from scalelab.orchestrator.plan.data_availability import hub_problems

    world_size, device = spec.backend.world_size, spec.backend.device
    environment: dict[tuple[object, object], JobCheckError | None] = {}
    problems: list[str] = []
    missing: list[tuple[Trial, MissingData]] = []
    hub: list[Trial] = []
    for trial in trials:
        errors = []
        try:
            check_placement(trial.job, world_size, device)
        except JobCheckError as e:
            errors.append(e)
        key = (trial.job.data, trial.job.model)
        if key not in environment:
            try:
                check_environment(trial.job, hub=False)
                environment[key] = None
            except JobCheckError as e:
                environment[key] = e
        error = environment[key]
        if isinstance(error, MissingData):
            missing.append((trial, error))
        elif error is not None:
            errors.append(error)
        elif trial.job.model.task == "classify" and trial.job.data.source.startswith("hf:"):
            hub.append(trial)  # what check_environment(hub=True) would resolve
        for error in errors:
            line = trial_problem(trial, error, source)
            if line not in problems:
                problems.append(line)
        if len(problems) >= MAX_PROBLEMS:
            break
    if problems:
        raise SpecError(problems)
    unresolved = hub_problems([t.job.data for t in hub])
    missing += [(t, unresolved[t.job.data.source]) for t in hub if t.job.data.source in unresolved]
    lines: dict[str, Missing] = {}
    for trial, error in missing:
        line = trial_problem(trial, error, source)
        lines.setdefault(line, Missing(trial.job.data.source, line))
    return tuple(sorted(lines.values(), key=lambda m: m.line))
