"""The training job's own checks (jobs/checks.py) on every trial of a sweep, run by
`submit` and `submit --dry-run` before any MLflow run exists.

A sweep whose trials cannot start (a data source that does not exist, a tokenizer larger
than model.vocab_size, a batch that does not split across the backend's ranks, fp16 on
CPU) is refused with one `file:line: key: message` per problem, instead of creating runs
that each fail. The data checks read this machine's files and tokenizer caches: they hold
for the trials when those run here or see the same filesystem (local, SLURM).
"""

from __future__ import annotations

from scalelab.jobs.checks import check_environment, check_placement
from scalelab.jobs.config import JobCheckError
from scalelab.orchestrator.expand import MAX_PROBLEMS, Trial, trial_problem
from scalelab.orchestrator.spec import SourceMap, SpecError, SweepSpec


def check_trials(spec: SweepSpec, trials: list[Trial], source: SourceMap) -> None:
    """Raise SpecError listing every (distinct) problem; the data checks run once per
    distinct (data, model) pair."""
    world_size, device = spec.backend.world_size, spec.backend.device
    environment: dict[tuple[object, object], JobCheckError | None] = {}
    problems: list[str] = []
    for trial in trials:
        errors = []
        try:
            check_placement(trial.job, world_size, device)
        except JobCheckError as e:
            errors.append(e)
        key = (trial.job.data, trial.job.model)
        if key not in environment:
            try:
                check_environment(trial.job)
                environment[key] = None
            except JobCheckError as e:
                environment[key] = e
        if environment[key] is not None:
            errors.append(environment[key])
        for error in errors:
            line = trial_problem(trial, error, source)
            if line not in problems:
                problems.append(line)
        if len(problems) >= MAX_PROBLEMS:
            break
    if problems:
        raise SpecError(problems)
