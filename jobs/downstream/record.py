"""A trained trial's scores on its MLflow run: which requested tasks the run still lacks,
and each task's scores written as one `log_batch` (with what ran: `eval/<task>/tsa_alpha`,
`.../budget_heads`, `.../soft_mode`) and lm-eval's full results as the artifact
`eval/<task>.json`. Shared by `scalelab eval` and a sweep's `eval.downstream` step
(docs/evaluation.md)."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from scalelab.contract.runs import Metric
from scalelab.jobs.downstream.score_trial import TaskScores, task_names


def owed(requested: list[str], metrics: Mapping[str, float]) -> list[str]:
    """The requested tasks (names or local YAMLs) whose scores are not among `metrics`."""
    names = _scored_as(tuple(requested))
    return [
        r
        for r, name in zip(requested, names, strict=True)
        if not any(k.startswith(f"{Metric.EVAL_PREFIX}{name}/") for k in metrics)
    ]


@lru_cache(maxsize=64)
def _scored_as(requested: tuple[str, ...]) -> tuple[str, ...]:
    """The names the tasks are scored under, read once per task list (a driver asks for
    every finished trial of a sweep)."""
    return tuple(task_names(list(requested)))


def score_onto_run(
    client: Any, run_id: str, located: Any, tasks: list[str], *, device: str,
    limit: int | None = None, mode: str = "inference", cache: bool | None = None,
    batch_size: int = 16,
) -> list[TaskScores]:  # fmt: skip
    """Score the tasks on the trial's checkpoint and write each one's scores to the run."""
    results = score(located, tasks, device=device, limit=limit, mode=mode, cache=cache,
                    batch_size=batch_size)  # fmt: skip
    for result in results:
        write(client, run_id, result, mode)
    return results


def score(
    located: Any,
    tasks: list[str],
    *,
    device: str,
    limit: int | None = None,
    mode: str = "inference",
    cache: bool | None = None,
    batch_size: int = 16,
) -> list[TaskScores]:
    """Each task's scores on the trial's checkpoint (loaded only once every task's data is
    here: jobs/downstream/score_trial.py)."""
    from scalelab.jobs.data.tokenizers import load_tokenizer
    from scalelab.jobs.downstream import score_trial as downstream
    from scalelab.jobs.training.trained_model import load_model

    data = located.job.data
    tokenizer = load_tokenizer(data.tokenizer, data.tokenizer_file)
    return downstream.evaluate(
        lambda: load_model(located, device),
        tokenizer, tasks, limit=limit, mode=mode, cache=cache, batch_size=batch_size,
    )  # fmt: skip


def write(client: Any, run_id: str, result: TaskScores, mode: str) -> None:
    """One task's scores and what ran, then its full results (so a run holding a task's
    metrics may lack only the artifact, never the other way round)."""
    from mlflow.entities import Metric as MlflowMetric

    extra = {f"{Metric.EVAL_PREFIX}{result.task}/soft_mode": float(mode == "soft")}
    for key in ("tsa_alpha", "budget_heads"):
        if key in result.executed:
            extra[f"{Metric.EVAL_PREFIX}{result.task}/{key}"] = result.executed[key]
    now = int(time.time() * 1000)
    batch = [MlflowMetric(k, v, now, 0) for k, v in sorted({**result.metrics, **extra}.items())]
    for start in range(0, len(batch), 1000):  # MLflow's limit per log_batch
        client.log_batch(run_id, metrics=batch[start : start + 1000])
    text = json.dumps(result.results, indent=1, sort_keys=True)
    client.log_text(run_id, text, f"eval/{result.task}.json")
