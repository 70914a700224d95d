"""A sweep's `eval.downstream`: lm-eval tasks run on a trial once it has trained, as a
step of that trial, in its own job (the same node and devices; jobs/launch.py). The step
is resumable: a trial whose training is done (its result.json) is not trained again, and
only the tasks whose scores its run lacks are evaluated. A failed evaluation leaves the
trial FINISHED (its training stands) with the reason as `scalelab.eval_error`; the next
submit evaluates what is still owed (docs/evaluation.md, 'In a sweep')."""

from __future__ import annotations

import sys
from typing import Any

from scalelab.contract import workdir
from scalelab.contract.outcome import trained
from scalelab.contract.runs import Tag


def evaluate_trained(job: Any, run_id: str | None) -> None:
    """Evaluate the owed tasks of `job.eval.downstream` on the trial's newest checkpoint and
    write their scores to its run; a failure is said in the trial's log and on the run."""
    from scalelab.jobs.downstream import record
    from scalelab.jobs.tracking import mlflow_store as store
    from scalelab.jobs.training.trained_model import locate

    wanted = job.eval.downstream
    run_id = run_id or (trained(job.trial_id) or {}).get("run_id")
    if wanted is None or not run_id:
        return
    client = store.client()
    try:
        run = client.get_run(run_id)
        todo = record.owed(list(wanted.tasks), run.data.metrics)
        if not todo:
            return
        print(f"[scalelab] eval.downstream: {', '.join(todo)}", flush=True)
        located = locate(str(workdir.trial_dir(job.trial_id)))
        for result in record.score_onto_run(
            client, run_id, located, todo, device=_device(), limit=wanted.limit,
            mode=wanted.mode, batch_size=wanted.batch_size,
        ):  # fmt: skip
            shown = {k.rsplit("/", 1)[1]: v for k, v in result.metrics.items()}
            on = result.executed.get("split")  # a packaged task's split (packaged.py)
            split = f" ({on}, {result.executed.get('items')} items)" if on else ""
            print(f"[scalelab] eval {result.task}{split}: {shown}", flush=True)
        if Tag.EVAL_ERROR in run.data.tags:  # an earlier attempt's reason, now stale
            client.delete_tag(run_id, Tag.EVAL_ERROR)
    except Exception as e:  # the training stands; the next submit evaluates again
        error = f"{type(e).__name__}: {e}"[:5000]
        print(f"[scalelab] eval.downstream failed: {error}", file=sys.stderr, flush=True)
        client.set_tag(run_id, Tag.EVAL_ERROR, error)


def _device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"
