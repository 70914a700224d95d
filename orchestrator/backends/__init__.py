"""Where trials run. Every backend turns a claimed trial into a Ray ObjectRef that resolves
to an outcome dict ({'status': 'FINISHED'|'FAILED'|'PREEMPTED', 'reason': str|None}), so the
scheduler waits on all of them the same way (`ray.wait`).

  local : an embedded Ray on this machine (ray.init(address='local')), on 127.0.0.1 only
  ray   : an existing Ray cluster by address (cloud GPUs through its autoscaler)
  slurm : submitit -> sbatch; a Ray task with a fraction of a CPU watches each SLURM job
"""

from __future__ import annotations

import importlib
import ipaddress
import os
import sys
from collections.abc import Callable
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any

from contract.runs import Status
from models.catalog import MECHANISMS_ENV

if TYPE_CHECKING:
    from orchestrator.expand import Trial
    from orchestrator.ledger import Ledger, TrialRecord
    from orchestrator.spec import BackendConfig

DEFAULT_JOB = "jobs.train:run"
JobRef = str | Callable[..., Any]


class BackendError(RuntimeError):
    """A backend cannot be used (not reachable, not installed); nothing was submitted."""


def resolve_job(ref: JobRef) -> Callable[..., Any]:
    """'module:function' -> the function (callables pass through)."""
    if callable(ref):
        return ref
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
    (a FAILED trial whose loss diverged: deterministic, so it is not retried)}."""
    if result is None:
        return {"status": Status.FINISHED, "reason": None, "metrics_pending": 0, "diverged": False}
    get = result.get if isinstance(result, dict) else lambda k, d: getattr(result, k, d)
    return {
        "status": get("status", Status.FINISHED),
        "reason": get("reason", None),
        "metrics_pending": get("metrics_pending", 0),
        "diverged": bool(get("diverged", False)),
    }


def run_job(job_ref: JobRef, job_json: str, run_id: str | None, ranks: int = 1) -> dict[str, Any]:
    """The body of one trial wherever it runs: rebuild the JobConfig, call the job (in
    `ranks` processes under torchrun when the trial has several), its output captured in
    the trial's log and attached to its run (jobs/trial_logs.py)."""
    from jobs.config import JobConfig
    from jobs.trial_logs import captured

    job = JobConfig.model_validate_json(job_json)
    with captured(job.trial_id, run_id, job.model_dump_json(indent=2)):  # trials/<id>/logs/
        if ranks > 1:
            if job_ref != DEFAULT_JOB:
                raise ValueError(f"several ranks per trial need the training job, not {job_ref!r}")
            return run_ranks(job, run_id, ranks)
        return outcome_of(resolve_job(job_ref)(job, run_id))


def run_ranks(job: Any, run_id: str | None, ranks: int) -> dict[str, Any]:
    """`ranks` processes of `python -m jobs.train` (one per GPU, or gloo ranks on CPU),
    started as torchrun would but with the rendezvous on 127.0.0.1 (jobs/local_ranks.py);
    DeepSpeed shards across them. The outcome comes from the result file the job writes last."""
    import json
    import tempfile
    import time

    from contract.workdir import RESULT_FILE, trial_dir
    from jobs.local_ranks import run_local_ranks

    result_path = trial_dir(job.trial_id) / RESULT_FILE
    started = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        config = os.path.join(tmp, "job.json")
        with open(config, "w") as f:
            f.write(job.model_dump_json())
        cmd = [sys.executable, "-m", "jobs.train", config, *([run_id] if run_id else [])]
        code = run_local_ranks(cmd, ranks)
    if result_path.exists() and result_path.stat().st_mtime >= started:
        return outcome_of(json.loads(result_path.read_text()))
    return {"status": Status.FAILED, "reason": f"{ranks} ranks: one exited with code {code}"}


def ray_init(address: str, *, embedded: bool) -> bool:
    """Connect to (or start) Ray once per process, quietly and without telemetry; True when
    this call connected (so the caller should disconnect when done, with `ray_shutdown`).

    A cluster started here (embedded, address 'local') listens on 127.0.0.1 only, requires a
    token and ends with this process (orchestrator.backends.embedded). Joining a cluster
    changes nothing of it: not its address, not its authentication."""
    from orchestrator.backends.embedded import SINGLE_NODE, driver_session, scoped_environ

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    starts = embedded and address == "local"
    with scoped_environ(SINGLE_NODE if starts else {}):
        import ray  # Ray reads single-node mode once, on its first import

    if ray.is_initialized():
        return False
    # Workers must import what the driver imports (the job function's module, tests' helpers).
    path = os.pathsep.join(p for p in sys.path if p and os.path.isdir(p))
    env = {"PYTHONPATH": path, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    if os.environ.get(MECHANISMS_ENV):  # mechanisms outside scalelab (models/catalog.py)
        env[MECHANISMS_ENV] = os.environ[MECHANISMS_ENV]
    kwargs: dict[str, Any] = {"address": address, "log_to_driver": True}
    if "RAY_JOB_CONFIG_JSON_ENV_VAR" not in os.environ:  # a Ray job (--detach) sets its own
        kwargs["runtime_env"] = {"env_vars": env}
    if embedded:
        kwargs.update(include_dashboard=False, logging_level="WARNING")
    session = driver_session() if starts else None
    if session:
        kwargs["_temp_dir"] = str(session.temp_dir)
    try:
        with session.starting_cluster() if session else nullcontext():
            ray.init(**kwargs)
    except (ConnectionError, RuntimeError, ValueError) as e:
        if session:
            ray_shutdown()  # whatever it had started
        raise BackendError(f"cannot connect to Ray at {address!r}: {e}") from None
    if session and not ipaddress.ip_address(ray.util.get_node_ip_address()).is_loopback:
        node_ip = ray.util.get_node_ip_address()
        ray_shutdown()  # fail closed
        raise BackendError(
            f"the embedded Ray came up on {node_ip}, not on 127.0.0.1 (Ray was imported before "
            "scalelab could choose its single-node mode); set "
            "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 in the environment"
        )
    return True


def ray_shutdown() -> None:
    """Disconnect from Ray; the processes of clusters this process started are all ended."""
    import ray

    from orchestrator.backends.embedded import end_embedded_clusters

    ray.shutdown()
    end_embedded_clusters()


class Backend:
    """Launch trials as Ray tasks; subclasses change where the work happens."""

    kind = "local"

    def __init__(self, cfg: BackendConfig, ledger: Ledger, job: JobRef = DEFAULT_JOB):
        self.cfg, self.ledger, self.job = cfg, ledger, job
        self.owns_ray = False

    def start(self) -> None:
        self.owns_ray = ray_init(os.environ.get("RAY_ADDRESS") or "local", embedded=True)

    def launch_many(self, items: list[tuple[Trial, TrialRecord]]) -> list[tuple[Any, str]]:
        """Start trials; returns (handle, job_ref) per item: an ObjectRef and its id."""
        import ray

        task = ray.remote(run_job).options(
            num_cpus=self.cfg.cpus_per_trial,
            num_gpus=self.cfg.gpus_per_trial,
            max_retries=0,  # the scheduler retries, with backoff and a FAILED tag
            name="scalelab-trial",
        )
        out = []
        for trial, rec in items:
            ref = task.remote(self.job, trial.job.model_dump_json(), rec.run_id, self.cfg.ranks)
            out.append((ref, f"ray:{ref.task_id().hex()}"))
        return out

    def cancel(self, handle: Any, rec: TrialRecord) -> None:
        import ray

        ray.cancel(handle, force=True)

    def stop(self) -> None:
        """Disconnect from Ray if this backend connected (a shared session stays up)."""
        import ray

        if self.owns_ray and ray.is_initialized():
            ray_shutdown()


def preflight(cfg: BackendConfig) -> None:
    """Check the backend is usable before anything is written to the ledger."""
    if cfg.kind == "slurm":
        from orchestrator.backends.slurm import check_slurm

        check_slurm()
    elif cfg.kind == "ray":
        ray_init(cfg.address, embedded=False)


def make_backend(cfg: BackendConfig, ledger: Ledger, job: JobRef = DEFAULT_JOB) -> Backend:
    if cfg.kind == "local":
        from orchestrator.backends.local import LocalBackend

        return LocalBackend(cfg, ledger, job)
    if cfg.kind == "ray":
        from orchestrator.backends.ray import RayClusterBackend

        return RayClusterBackend(cfg, ledger, job)
    if cfg.kind == "slurm":
        from orchestrator.backends.slurm import SlurmBackend

        return SlurmBackend(cfg, ledger, job)
    raise BackendError(f"unknown backend {cfg.kind!r}; allowed: local, ray, slurm")
