"""Downstream tasks scored while a trial trains, as OLMo's model ladder does (docs/evaluation.md,
"During training"): at every validation, a fixed subset of each multiple-choice task is
ranked by the model's log-likelihood of each choice, and the accuracy and the correct
answer's bits per byte are logged beside the validation loss.

The questions are lm-eval's own (its prompts, choices, targets and `process_results`, so
`acc` and `acc_norm` are what `scalelab eval` would give on the same items); only the
requests are built once, at the start, and scored through the same adapter as
`scalelab eval` (jobs/downstream/adapter.py) on the model being trained, in its inference
mode, then put back as it was. The subset is the task's first `items` documents, as lm-eval's
`--limit` takes them, so every evaluation and every trial of a sweep sees the same items.

Bits per byte of the correct answer, -log2 p(answer | question) / its UTF-8 bytes, is the
smooth intermediate that the two-step accuracy forecasts fit (Bhagia et al. 2024): it moves
long before the accuracy leaves chance.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from scalelab.contract.runs import Metric
from scalelab.jobs.downstream import tasks as task_loading
from scalelab.jobs.downstream.tasks import TaskError


@dataclass(frozen=True)
class Question:
    doc: Any
    requests: tuple[Any, ...]  # lm-eval's Instances, one per choice: args (context, continuation)
    gold: int  # the index of the correct choice


@dataclass(frozen=True)
class InLoopTask:
    name: str
    task: Any  # lm-eval's task: its process_results scores a question
    questions: tuple[Question, ...]


def metric_names(task: str) -> tuple[str, str, str]:
    """The curves one task logs: accuracy, length-normalised accuracy, the answer's bpb."""
    prefix = f"{Metric.IN_LOOP_PREFIX}{task}"
    return f"{prefix}_acc", f"{prefix}_acc_norm", f"{prefix}_bpb"


def load_tasks(names: list[str], items: int) -> list[InLoopTask]:
    """Each named task's first `items` questions (TaskError for a task that is not
    multiple choice, or whose data is not here)."""
    out = []
    for name in names:
        leaves = list(task_loading.load([name])["tasks"].values())
        if len(leaves) != 1:
            raise TaskError(f"{name}: a group of {len(leaves)} tasks; name its tasks one by one")
        task = leaves[0]
        if task.OUTPUT_TYPE != "multiple_choice":
            raise TaskError(
                f"{name}: in-loop evaluation ranks the choices of multiple-choice tasks; "
                f"this one is {task.OUTPUT_TYPE}"
            )
        task.build_all_requests(limit=items, rank=0, world_size=1)
        by_doc: dict[int, list[Any]] = defaultdict(list)
        for inst in task.instances:
            by_doc[inst.doc_id].append(inst)
        questions = []
        for doc_id in sorted(by_doc):
            insts = sorted(by_doc[doc_id], key=lambda i: i.idx)
            doc = insts[0].doc
            questions.append(Question(doc, tuple(insts), _gold(task, doc)))
        out.append(InLoopTask(name, task, tuple(questions)))
    return out


def _gold(task: Any, doc: Any) -> int:
    """The correct choice's index, as lm-eval's process_results reads it."""
    gold = task.doc_to_target(doc)
    if isinstance(gold, str):
        gold = task.doc_to_choice(doc).index(gold)
    if isinstance(gold, list) or not 0 <= int(gold) < len(task.doc_to_choice(doc)):
        raise TaskError(f"{task.config.task}: in-loop evaluation needs one correct choice")
    return int(gold)


class InLoopEvaluation:
    """The loaded tasks, scored on demand on a model (see module doc)."""

    def __init__(self, tasks: list[InLoopTask], tokenizer: Any, batch_size: int) -> None:
        self.tasks, self.tokenizer, self.batch_size = tasks, tokenizer, batch_size

    def score(self, model: Any) -> dict[str, float]:
        """Each task's accuracy, normalised accuracy and correct-answer bits per byte, and
        the seconds it took (`<prefix>seconds`); the model is left in the mode it was in."""
        from scalelab.jobs.downstream.adapter import TrialLM

        t0 = time.perf_counter()
        was_training = model.training
        sparse = getattr(model.depth, "sparse_inference", None)
        lm = TrialLM(model, self.tokenizer, mode="inference", batch_size=self.batch_size)
        metrics: dict[str, float] = {}
        try:
            for t in self.tasks:
                requests = [r for q in t.questions for r in q.requests]
                results = iter(lm.loglikelihood(requests, disable_tqdm=True))
                acc, acc_norm, bpb = [], [], []
                for q in t.questions:
                    answers = [next(results) for _ in q.requests]
                    scored = t.task.process_results(q.doc, answers)
                    acc.append(float(scored["acc"]))
                    acc_norm.append(float(scored.get("acc_norm", scored["acc"])))
                    answer = q.requests[q.gold].args[1]
                    bpb.append(-answers[q.gold][0] / math.log(2) / len(answer.encode("utf-8")))
                for key, values in zip(metric_names(t.name), (acc, acc_norm, bpb), strict=True):
                    metrics[key] = sum(values) / len(values)
        finally:
            lm.executed.detach()
            model.train(was_training)
            if sparse is not None:
                model.depth.sparse_inference = sparse
        metrics[f"{Metric.IN_LOOP_PREFIX}seconds"] = time.perf_counter() - t0
        return metrics


def open_in_loop(job: Any) -> InLoopEvaluation | None:
    """The job's `eval.in_loop`, its tasks loaded and the trial's tokenizer ready; None
    when it has none."""
    wanted = job.eval.in_loop
    if wanted is None:
        return None
    from scalelab.jobs.data.tokenizers import load_tokenizer

    tasks = load_tasks(list(wanted.tasks), wanted.items)
    tokenizer = load_tokenizer(job.data.tokenizer, job.data.tokenizer_file)
    return InLoopEvaluation(tasks, tokenizer, wanted.batch_size)
