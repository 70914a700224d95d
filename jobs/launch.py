"""The one door into a trial, wherever it runs (docs/architecture.md, 'Layers'): a Ray task
(local and ray backends) and a SLURM job (submitit) both call `launch`, which runs the job
body in this process or in `ranks` processes; each rank then runs `jobs.training.train.run` (through
`python -m scalelab.jobs.training.train` or `scalelab train`). Torch-free at import.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from typing import Any

from scalelab.contract.outcome import EXIT_REFUSED, EnvironmentRefused, trained
from scalelab.contract.placement import DeviceAsk
from scalelab.contract.runs import Status
from scalelab.jobs.environ import scoped_environ

DEFAULT_JOB = "scalelab.jobs.training.train:run"
JobRef = str | Callable[..., Any]  # a job body, or 'module:function' (the CLI's --job hook)


def resolve_job(ref: JobRef) -> Callable[..., Any]:
    """The job body: training by a plain import; another 'module:function' (a developer's
    `--job`, from the command line only) by name; callables pass through."""
    if callable(ref):
        return ref
    if ref == DEFAULT_JOB:
        from scalelab.jobs.training.train import run

        return run
    module, _, name = ref.partition(":")
    if not name:
        raise ValueError(f"a job is 'module:function', got {ref!r}")
    obj: Any = importlib.import_module(module)
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


def outcome_of(result: Any) -> dict[str, Any]:
    """A job's return value (TrainResult, dict, None) -> {'status', 'reason',
    'metrics_pending' (MLflow writes the job left spooled in its trial folder), 'diverged'
    (a FAILED trial whose loss diverged: deterministic, so it is not retried), 'refused'
    (its node cannot run it as placed: not retried either)}."""
    if result is None:
        return {"status": Status.FINISHED, "reason": None, "metrics_pending": 0,
                "diverged": False, "refused": False}  # fmt: skip
    get = result.get if isinstance(result, dict) else lambda k, d: getattr(result, k, d)
    return {
        "status": get("status", Status.FINISHED),
        "reason": get("reason", None),
        "metrics_pending": get("metrics_pending", 0),
        "diverged": bool(get("diverged", False)),
        "refused": bool(get("refused", False)),
    }


def refused(reason: str) -> dict[str, Any]:
    """The outcome of a trial its node refused (EnvironmentRefused), said in its log too
    (file descriptor 2: the trial's log while `captured`, whoever replaced sys.stderr)."""
    sys.stderr.flush()
    os.write(2, f"[scalelab] refused: {reason}\n".encode())
    return {"status": Status.FAILED, "reason": reason, "metrics_pending": 0,
            "diverged": False, "refused": True}  # fmt: skip


def launch(
    job_ref: JobRef,
    job_json: str,
    run_id: str | None,
    ranks: int = 1,
    artifact_uri: str = "",
    ask: DeviceAsk | None = None,
) -> dict[str, Any]:
    """The body of one trial wherever it runs: rebuild the JobConfig, call the job (in
    `ranks` processes under torchrun when the trial has several), its output captured in
    the trial's log and attached to its run (jobs/tracking/trial_logs.py; `artifact_uri`:
    the run's, when the driver knows it). `ask`: the devices its placement gives it, which
    the job checks it has (contract/placement.py); a node that has not is refused."""
    from scalelab.jobs.config import JobConfig
    from scalelab.jobs.tracking.trial_logs import captured

    job = JobConfig.model_validate_json(job_json)
    placement = (ask or DeviceAsk()).environ()
    with (
        captured(job.trial_id, run_id, job.model_dump_json(indent=2), artifact_uri),
        scoped_environ(placement),  # the job's ranks inherit it; a reused worker forgets it
    ):
        try:
            outcome = _trained_outcome(job) or _train(job_ref, job, run_id, ranks)
        except EnvironmentRefused as e:
            return refused(str(e))
        if job.eval.downstream is not None and outcome["status"] == Status.FINISHED:
            from scalelab.jobs.downstream.step import evaluate_trained

            evaluate_trained(job, run_id)
        return outcome


def _train(job_ref: JobRef, job: Any, run_id: str | None, ranks: int) -> dict[str, Any]:
    if ranks > 1:
        if job_ref != DEFAULT_JOB:
            raise ValueError(f"several ranks per trial need the training job, not {job_ref!r}")
        return run_ranks(job, run_id, ranks)
    return outcome_of(resolve_job(job_ref)(job, run_id))


def _trained_outcome(job: Any) -> dict[str, Any] | None:
    """A trial with an `eval.downstream` step whose training is done (a driver killed in its
    evaluation): FINISHED without training again; only its evaluation is owed."""
    if job.eval.downstream is None or trained(job.trial_id) is None:
        return None
    return outcome_of({"status": Status.FINISHED})


def run_ranks(job: Any, run_id: str | None, ranks: int) -> dict[str, Any]:
    """`ranks` processes of `python -m scalelab.jobs.training.train` (one per GPU, or gloo ranks on CPU),
    started as torchrun would but with the rendezvous on 127.0.0.1 (jobs/training/local_ranks.py);
    DeepSpeed shards across them. Rank 0 prints where this process does (the trial's log,
    under `launch`), rank r > 0 into logs/rank<r>.log (jobs/tracking/trial_logs.py). The
    outcome comes from the result file the job writes last."""
    import json
    import tempfile
    import time

    from scalelab.contract.workdir import RESULT_FILE, trial_dir
    from scalelab.jobs.tracking.trial_logs import open_log
    from scalelab.jobs.training.devices import check_node
    from scalelab.jobs.training.local_ranks import run_local_ranks

    check_node(ranks)  # before any rank starts: a node that cannot hold them all refuses
    result_path = trial_dir(job.trial_id) / RESULT_FILE
    started = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        config = os.path.join(tmp, "job.json")
        with open(config, "w") as f:
            f.write(job.model_dump_json())
        cmd = [
            sys.executable,
            "-m",
            "scalelab.jobs.training.train",
            config,
            *([run_id] if run_id else []),
        ]
        logs = [open_log(job.trial_id, r, run_id) for r in range(1, ranks)]
        try:
            code = run_local_ranks(cmd, ranks, outputs=[None, *logs])
        finally:
            for f in logs:
                f.close()
    if result_path.exists() and result_path.stat().st_mtime >= started:
        return outcome_of(json.loads(result_path.read_text()))
    if code == EXIT_REFUSED:
        return refused(f"{ranks} ranks: one refused its node (exit {code}; why: the trial's log)")
    return {"status": Status.FAILED, "reason": f"{ranks} ranks: one exited with code {code}"}
