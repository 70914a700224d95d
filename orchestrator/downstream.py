"""`scalelab eval`: a trained trial on lm-eval tasks, its scores on the trial's MLflow run
(docs/evaluation.md).

The trial is named as `generate` names it (a run name, a trial id or prefix, a trial or
checkpoint folder). Its run gets the metrics `eval/<task>/<metric>` (one log_batch per
task, with what ran: `eval/<task>/tsa_alpha`, `.../budget_heads`, `.../soft_mode`) and
lm-eval's full results as the artifact `eval/<task>.json`; the results tables read the
metrics from the run (analysis/results/sync.py). A task whose scores the run already holds
is not evaluated again (`force` re-evaluates). Nothing here imports torch at module level.
"""

from __future__ import annotations

import json
import time
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
    from scalelab.jobs.downstream.evaluate import task_names
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
    held = {k for k in run.data.metrics if k.startswith(Metric.EVAL_PREFIX)}
    todo = [
        (requested, name)
        for requested, name in zip(tasks, names, strict=True)
        if options.force or not any(k.startswith(f"{Metric.EVAL_PREFIX}{name}/") for k in held)
    ]
    answer = EvalAnswer(
        located.job.trial_id, run.info.run_id, run.info.run_name or "", str(located.tag_dir),
        {}, {}, [n for n in names if n not in {name for _, name in todo}],
    )  # fmt: skip
    if not todo:
        return answer
    scored = _score(located, [r for r, _ in todo], options)
    for result in scored:
        extra = {f"{Metric.EVAL_PREFIX}{result.task}/soft_mode": float(options.mode == "soft")}
        for key in ("tsa_alpha", "budget_heads"):
            if key in result.executed:
                extra[f"{Metric.EVAL_PREFIX}{result.task}/{key}"] = result.executed[key]
        _log(client, run.info.run_id, {**result.metrics, **extra})
        client.log_text(
            run.info.run_id,
            json.dumps(result.results, indent=1, sort_keys=True),
            f"eval/{result.task}.json",
        )
        answer.scores.update(result.metrics)
        answer.executed[result.task] = result.executed
    return answer


def _score(located: Any, tasks: list[str], options: EvalOptions) -> list:
    from scalelab.jobs.data.tokenizers import load_tokenizer
    from scalelab.jobs.downstream import evaluate as downstream
    from scalelab.jobs.downstream.tasks import TaskError
    from scalelab.jobs.training.trained_model import TrialError, load_model

    try:
        tokenizer = load_tokenizer(located.job.data.tokenizer, located.job.data.tokenizer_file)
        return downstream.evaluate(
            lambda: load_model(located, options.device),
            tokenizer, tasks, limit=options.limit, mode=options.mode,
            cache=options.cache, batch_size=options.batch_size,
        )  # fmt: skip
    except (TrialError, TaskError) as e:
        raise EvalError(str(e)) from None


def _log(client: Any, run_id: str, metrics: dict[str, float]) -> None:
    from mlflow.entities import Metric as MlflowMetric

    now = int(time.time() * 1000)
    batch = [MlflowMetric(k, v, now, 0) for k, v in sorted(metrics.items())]
    for start in range(0, len(batch), 1000):  # MLflow's limit per log_batch
        client.log_batch(run_id, metrics=batch[start : start + 1000])


def _client() -> Any:
    from scalelab.orchestrator.ledger import LedgerUnavailable
    from scalelab.orchestrator.ledger.store import check_reachable, guarded_client

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
