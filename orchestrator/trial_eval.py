"""`scalelab eval`: a trained trial on lm-eval tasks, its scores on the trial's MLflow run
(docs/evaluation.md).

The trial is named as `generate` names it (a run name, a trial id or prefix, a trial or
checkpoint folder). Its run gets the metrics `eval/<task>/<metric>` (one log_batch per
task, with what ran: `eval/<task>/tsa_alpha`, `.../budget_heads`, `.../soft_mode`) and
lm-eval's full results as the artifact `eval/<task>.json` (jobs/downstream/record.py); the
results tables read the metrics from the run (analysis/results/sync.py). A task whose scores the run already holds
is not evaluated again (`force` re-evaluates). Nothing here imports torch at module level.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import Field

from scalelab.contract import workdir
from scalelab.contract.config import FrozenConfig
from scalelab.contract.runs import Metric, Tag, search_all, tag_filter
from scalelab.contract.trial_time import trial_run_rank


class EvalError(ValueError):
    """A trial, run or task that cannot be evaluated, with the one-line reason."""


@dataclass(frozen=True)
class EvalAnswer:
    trial_id: str
    run_id: str
    run_name: str
    checkpoint: str
    scores: dict[str, float]  # eval/<task>/<metric>, of the tasks evaluated now
    executed: dict[str, dict[str, Any]]  # task -> what ran
    skipped: list[str] = field(default_factory=list)  # tasks whose scores the run held
    sweep: str = ""  # the run's sweep (or experiment): the results table that reads it


class EvalOptions(FrozenConfig):
    """How a trial is evaluated (`scalelab eval`'s options)."""

    limit: int | None = Field(None, ge=1, description="items per task (all when unset)")
    mode: Literal["inference", "soft"] = Field(
        "inference", description="TSA/BudgetFormer inference path (sparse, top-k) or soft"
    )
    cache: bool | None = Field(None, description="KV-cache log-likelihoods (inference only)")
    batch_size: int = Field(16, ge=1, description="sequences per forward")
    device: str = Field("cpu", description="cpu or cuda")
    force: bool = Field(False, description="evaluate tasks whose scores the run holds")


def evaluate(
    target: str, tasks: list[str], options: EvalOptions | None = None, *, sweep: str | None = None
) -> EvalAnswer:
    from scalelab.jobs.downstream import record
    from scalelab.jobs.downstream.score_trial import task_names
    from scalelab.jobs.downstream.tasks import TaskError
    from scalelab.jobs.training.trained_model import TrialError
    from scalelab.orchestrator.trial_select import located_trial

    options = options or EvalOptions()
    try:
        located = located_trial(target, sweep)
        if located.job.model.task != "lm":
            raise EvalError(f"trial {located.job.trial_id} trains a classifier; eval needs an LM")
        names = task_names(tasks)
    except (TrialError, TaskError) as e:
        raise EvalError(str(e)) from None
    client = _client()
    run = _trial_run(client, located.job.trial_id)
    todo = tasks if options.force else record.owed(tasks, run.data.metrics)
    answer = EvalAnswer(
        located.job.trial_id, run.info.run_id, run.info.run_name or "", str(located.tag_dir),
        {}, {}, [n for r, n in zip(tasks, names, strict=True) if r not in todo],
        run.data.tags.get(Tag.SWEEP) or client.get_experiment(run.info.experiment_id).name,
    )  # fmt: skip
    if not todo:
        return answer
    try:
        scored = record.score_onto_run(
            client, run.info.run_id, located, todo, device=options.device,
            limit=options.limit, mode=options.mode, cache=options.cache,
            batch_size=options.batch_size,
        )  # fmt: skip
    except (TrialError, TaskError) as e:
        raise EvalError(str(e)) from None
    for result in scored:
        answer.scores.update(result.metrics)
        answer.executed[result.task] = result.executed
    return answer


RAN = ("soft_mode", "tsa_alpha", "budget_heads")  # what ran, logged beside a task's scores
WALL = "wall_s"  # the task's evaluation time (jobs/downstream/score_trial.py)


def scored_names(tasks: list[str]) -> list[str]:
    """The name each requested task's scores are under (a local YAML: its `task:`)."""
    from scalelab.jobs.downstream.score_trial import task_names
    from scalelab.jobs.downstream.tasks import TaskError

    try:
        return task_names(tasks)
    except TaskError as e:
        raise EvalError(str(e)) from None


def check_tasks(tasks: list[str]) -> None:
    """Every task loads here, with its data (EvalError, one line, for the first that does
    not): what a sweep's evaluation checks before any job starts."""
    from scalelab.jobs.downstream import tasks as task_loading

    for name in tasks:
        try:
            task_loading.load([name])
        except task_loading.TaskError as e:
            raise EvalError(str(e)) from None


def score_text(task: str, metrics: dict[str, float]) -> str:
    """'acc 0.3750, acc_norm 0.2500': the task's scores among `metrics` (a run's, or an
    evaluation's eval/<task>/<metric>), without their stderr, what ran or the time."""
    prefix = f"{Metric.EVAL_PREFIX}{task}/"
    shown = {k.removeprefix(prefix): v for k, v in metrics.items() if k.startswith(prefix)}
    return ", ".join(
        f"{k} {v:.4f}" for k, v in sorted(shown.items())
        if "stderr" not in k and k not in (*RAN, WALL)
    )  # fmt: skip


def ran_text(task: str, metrics: dict[str, float]) -> str:
    """'mode inference, budget_heads 2.000, 3.12s': what ran for the task, from a run's
    metrics, and how long the evaluation took."""
    prefix = f"{Metric.EVAL_PREFIX}{task}/"
    parts = []
    if f"{prefix}soft_mode" in metrics:
        parts.append(f"mode {'soft' if metrics[f'{prefix}soft_mode'] else 'inference'}")
    parts += [f"{k} {metrics[prefix + k]:.3f}" for k in RAN[1:] if prefix + k in metrics]
    if prefix + WALL in metrics:
        parts.append(f"{metrics[prefix + WALL]:.3g}s")
    return ", ".join(parts)


def _client() -> Any:
    from scalelab.orchestrator.ledger import LedgerUnavailable
    from scalelab.orchestrator.ledger.connection import check_reachable, guarded_client

    uri = workdir.tracking_uri()
    try:
        check_reachable(uri)
    except LedgerUnavailable as e:
        raise EvalError(str(e)) from None
    return guarded_client(uri)


def _trial_run(client: Any, trial_id: str) -> Any:
    """The trial's run, the one the ledger and `results sync` read (trial_run_rank)."""
    experiments = [e.experiment_id for e in client.search_experiments()]
    runs = (
        search_all(client, experiments, tag_filter(Tag.TRIAL_ID, trial_id)) if experiments else []
    )
    if not runs:
        raise EvalError(
            f"trial {trial_id} has no run in {workdir.tracking_uri()} to write its scores to"
        )
    return min(runs, key=trial_run_rank)
