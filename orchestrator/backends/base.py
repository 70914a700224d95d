"""What every backend shares: the options every sweep's `backend:` takes (`BackendOptions`,
and `RayTaskOptions` for trials that are Ray tasks), a Ray session (joined or started here,
on 127.0.0.1 only when started) and the launch of trials as Ray tasks that call
`jobs.launch.launch`. A backend is a `Backend` subclass and its options class, in one module,
registered by kind (orchestrator/backends/registry.py)."""

from __future__ import annotations

import ipaddress
import logging
import math
import os
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import Field, field_validator

from scalelab.contract import workdir
from scalelab.contract.config import FrozenConfig
from scalelab.contract.placement import DeviceAsk
from scalelab.contract.runs import job_ref
from scalelab.jobs.gpus import gpu_spec
from scalelab.jobs.launch import DEFAULT_JOB, JobRef, launch
from scalelab.models.catalog import MECHANISMS_ENV

if TYPE_CHECKING:
    from scalelab.orchestrator.ledger import Ledger, TrialRecord
    from scalelab.orchestrator.plan.expand import Trial


# Ray 2.60 waits a fixed 30 s for a new node to register (ray/_private/node.py), which an
# overloaded machine can exceed; a cluster started here is then started again.
RAY_SLOW_START = "timed out during startup"
TASK_NAME = "scalelab-trial"  # a trial's Ray task: `scalelab-trial:<trial id>:<attempt>`
EMBEDDED_START_TRIES = 3


def shared_with_cluster() -> dict[str, str]:
    """What a trial on a joined cluster (backend `ray`) must share with its driver, as a
    SLURM job shares it through the submitting environment: the work directory (trial
    folders, checkpoints), the prepared data and the tracking store that holds the runs the
    driver made, resolved here (docs/running-on-ray.md)."""
    env = {
        "SCALELAB_HOME": str(workdir.scalelab_home()),
        "MLFLOW_TRACKING_URI": workdir.tracking_uri(),
    }
    if os.environ.get("SCALELAB_DATA"):
        env["SCALELAB_DATA"] = str(workdir.data_dir())
    return env


class BackendError(RuntimeError):
    """A backend cannot be used (not reachable, not installed); nothing was submitted."""


class BackendOptions(FrozenConfig):
    """Where trials run: the keys of `backend:` that every kind takes (placement, not
    science: nothing here is part of a trial's id). A backend's options class derives from
    it, narrows `kind` to its own name (`kind: Literal["slurm"] = "slurm"`) and adds its
    keys; its properties below tell the planner (orchestrator/plan/planner.py), the CPU-rate
    probe and the tracking-store check what the backend's trials get, and a backend whose
    trials are not one process group on one node overrides them (SlurmOptions)."""

    kind: str
    gpu: str | None = Field(
        None,
        description="the GPU model of the trials' nodes, e.g. 'H100 SXM' (jobs/gpus.py): "
        "the plan checks each trial's memory against it and times it at its peak",
    )
    concurrency: int = Field(2, ge=1, description="trials running at once")
    cpus_per_trial: float = Field(1.0, ge=0)
    gpus_per_trial: float = Field(0.0, ge=0)
    ranks_per_trial: int | None = Field(
        None,
        ge=1,
        description="local/ray: training processes per trial, started inside the trial's task "
        "with their rendezvous on 127.0.0.1 (DeepSpeed shards across them); default: one per "
        "GPU, else 1",
    )
    allow_file_tracking: bool = Field(
        False,
        description="slurm, or ray with a cluster address: let the trials write a "
        "file-backed tracking store (sqlite, file:) or one at a loopback address (127.0.0.1, "
        "localhost, ::1). Only where every job runs on the driver's machine: several machines "
        "writing one sqlite file lock it up or corrupt it, and a node's loopback address is "
        "the node itself (docs/running-on-slurm.md, 'The tracking store on a cluster')",
    )
    max_retries: int = Field(2, ge=0, description="re-runs of a FAILED trial")
    retry_backoff_s: float = Field(5.0, ge=0, description="first retry delay; doubles")

    # Whether every trial runs on this machine (the driver's): the CPU-rate probe then
    # measures the trials' own CPU, and the trials may write a file-backed tracking store.
    trials_run_here: ClassVar[bool] = False

    @field_validator("gpu")
    @classmethod
    def _known_gpu(cls, name: str | None) -> str | None:
        return None if name is None else gpu_spec(name).name

    @property
    def ranks(self) -> int:
        """Training processes a trial's task starts (ranks_per_trial, else one per GPU)."""
        return self.ranks_per_trial or max(1, int(self.gpus_per_trial))

    @property
    def nodes(self) -> int:
        """Nodes per trial."""
        return 1

    @property
    def ranks_per_node(self) -> int:
        return self.ranks

    @property
    def world_size(self) -> int:
        """Training processes per trial."""
        return self.nodes * self.ranks_per_node

    @property
    def gpus_per_node(self) -> float:
        """GPUs a trial gets on each of its nodes (0: a CPU trial)."""
        return self.gpus_per_trial

    @property
    def host_bytes_per_node(self) -> int | None:
        """Host RAM a trial may use on each node, where the options say; None: unknown."""
        return None

    @property
    def device(self) -> str | None:
        """'cuda' or 'cpu' for the trials, where the options decide it (Ray hides the GPUs
        from a task that asks for none); None where the node decides."""
        return "cuda" if self.gpus_per_trial > 0 else "cpu"

    @property
    def device_ask(self) -> DeviceAsk:
        """What a trial's job must find on its node (contract/placement.py): on Ray the GPUs
        the task is given (Ray hides the others), named by `gpu` only when it asks some."""
        gpus = math.ceil(self.gpus_per_trial)
        return DeviceAsk(gpus, self.gpu if gpus else None)

    @property
    def time_limit_s(self) -> float | None:
        """A job's wall-clock limit, after which it requeues itself; None: no limit."""
        return None

    @property
    def nodes_key(self) -> str | None:
        """The dotted sweep key that sets the nodes per trial (the plan's fix may raise it);
        None where a trial has one node."""
        return None

    def writers_elsewhere(self) -> str | None:
        """Who writes the tracking store from machines other than this one, in words (the
        store must then be a server they reach); None when only this machine does."""
        if self.trials_run_here:
            return None
        return f"the trials of backend {self.kind!r} write it from their own machines"


# Ray's own resources, which its `resources=` option refuses (num_cpus, num_gpus, ...)
RAY_BUILTIN_RESOURCES = ("CPU", "GPU", "memory", "object_store_memory")


class RayTaskOptions(BackendOptions):
    """The options of a backend whose trials are Ray tasks (`Backend.launch_many`)."""

    resources_per_trial: dict[str, float] = Field(
        default_factory=dict,
        description="local/ray: Ray custom resources each trial asks for besides its CPUs and "
        "GPUs, e.g. {gpu_a100: 1} to place it on the node type that offers it (docs/"
        "running-on-ray.md): a cluster's autoscaler adds such nodes when trials ask",
    )

    @field_validator("resources_per_trial")
    @classmethod
    def _custom_resources(cls, asked: dict[str, float]) -> dict[str, float]:
        for name, amount in asked.items():
            if not name.strip() or name in RAY_BUILTIN_RESOURCES:
                raise ValueError(
                    f"{name!r} is not a custom resource (CPUs and GPUs have their own keys: "
                    "cpus_per_trial, gpus_per_trial)"
                )
            if not amount > 0:
                raise ValueError(f"{name}: the amount must be > 0, got {amount}")
        return asked


def ray_init(address: str, *, embedded: bool, workers: int | None = None) -> bool:
    """Connect to (or start) Ray once per process, quietly and without telemetry; True when
    this call connected (so the caller should disconnect when done, with `ray_shutdown`).

    A cluster started here (embedded, address 'local') listens on 127.0.0.1 only, requires a
    token and ends with this process (orchestrator.backends.embedded). Joining a cluster
    changes nothing of it: not its address, not its authentication. `workers`: how many
    idle worker processes a cluster started here keeps (the sweep's concurrency) instead
    of ending them after 10 s idle and starting new ones: Ray 2.60's workers sometimes abort
    as they end idle ("Mutex corrupt", absl; docs/benchmarks.md, orchestration), and each
    start costs a new interpreter."""
    from scalelab.orchestrator.backends.embedded import (
        SINGLE_NODE,
        driver_pythonpath,
        driver_session,
        scoped_environ,
        spilling_directory,
    )

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    starts = embedded and address == "local"
    with scoped_environ(SINGLE_NODE if starts else {}):
        import ray  # Ray reads single-node mode once, on its first import

    if ray.is_initialized():
        return False
    env = {
        "PYTHONPATH": driver_pythonpath(),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
    }
    if os.environ.get(MECHANISMS_ENV):  # mechanisms outside scalelab (models/catalog.py)
        env[MECHANISMS_ENV] = os.environ[MECHANISMS_ENV]
    if not embedded:  # a cluster's nodes have their own environment: where to write is ours
        env |= shared_with_cluster()
    kwargs: dict[str, Any] = {"address": address, "log_to_driver": True}
    if not starts and "RAY_JOB_CONFIG_JSON_ENV_VAR" not in os.environ:  # a Ray job sets its own
        kwargs["runtime_env"] = {"env_vars": env}
    if embedded:
        kwargs.update(include_dashboard=False, logging_level="WARNING")
    if starts:
        kwargs["_system_config"] = _embedded_workers(workers)
        if spill := spilling_directory():  # the user's RAY_object_spilling_config, stably
            kwargs["object_spilling_directory"] = spill
    session = driver_session() if starts else None
    if session:
        kwargs["_temp_dir"] = str(session.temp_dir)
    for attempt in range(1, EMBEDDED_START_TRIES + 1):
        try:
            # a cluster started here hands `env` to its workers as their raylet's own
            # environment: as a runtime env, Ray's agent is asked for it at every worker
            # lease, a quarter of the cluster's CPU in a sweep of short trials
            # (docs/benchmarks.md, "Orchestrator")
            with session.starting_cluster(env) if session else nullcontext():
                ray.init(**kwargs)
            break
        except (ConnectionError, RuntimeError, ValueError) as e:
            if session:
                ray_shutdown()  # whatever it had started
            raise BackendError(f"cannot connect to Ray at {address!r}: {e}") from None
        except Exception as e:  # Ray raises a bare Exception for a slow node start
            if not (session and RAY_SLOW_START in str(e)):
                raise
            ray_shutdown()  # its GCS and raylet, half started
            if attempt == EMBEDDED_START_TRIES:
                raise BackendError(
                    f"the embedded Ray did not start: its node did not register within Ray's "
                    f"30 s, {EMBEDDED_START_TRIES} times (is this machine overloaded?)"
                ) from None
            logging.getLogger(__name__).warning(
                "the embedded Ray's node did not register within Ray's 30 s (a busy machine); "
                "starting it again (%d of %d)",
                attempt + 1,
                EMBEDDED_START_TRIES,
            )
    if session and not ipaddress.ip_address(ray.util.get_node_ip_address()).is_loopback:
        node_ip = ray.util.get_node_ip_address()
        ray_shutdown()  # fail closed
        raise BackendError(
            f"the embedded Ray came up on {node_ip}, not on 127.0.0.1 (Ray was imported before "
            "scalelab could choose its single-node mode); set "
            "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 in the environment"
        )
    return True


def _embedded_workers(keep: int | None) -> dict[str, int]:
    """Ray's worker settings for a cluster this process starts: `keep` idle workers (see
    ray_init), and worker processes started a quarter of the cores at a time (Ray starts
    one per core at once): each start is an interpreter and `import ray`, ~1 s of CPU, and
    a sweep of short trials on few cores otherwise starts workers faster than trials end,
    on the cores the driver needs (27-31 workers for 200 no-op trials on 2 cores, 12 with
    one at a time: docs/benchmarks.md, "Orchestrator")."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    config = {"worker_maximum_startup_concurrency": max(1, (cores or 1) // 4)}
    if keep:
        config["num_workers_soft_limit"] = keep
    return config


def ray_shutdown() -> None:
    """Disconnect from Ray; the processes of clusters this process started are all ended."""
    import ray

    from scalelab.orchestrator.backends.embedded import end_embedded_clusters

    ray.shutdown()
    end_embedded_clusters()


class Backend:
    """Launch trials as Ray tasks; subclasses change where the work happens. A subclass
    names its `kind` (the sweep's `backend.kind`) and its `options` class, whose `kind`
    is that name, and is registered (orchestrator/backends/registry.py). Every handle
    `launch_many` returns is a Ray ObjectRef that resolves to the trial's outcome dict."""

    kind: ClassVar[str]
    options: ClassVar[type[BackendOptions]]

    cfg: Any  # an instance of `options` (Any: each backend reads its own keys)

    def __init__(self, cfg: BackendOptions, ledger: Ledger, job: JobRef = DEFAULT_JOB):
        self.cfg, self.ledger, self.job = cfg, ledger, job
        self.owns_ray = False

    @classmethod
    def preflight(cls, cfg: BackendOptions) -> None:
        """Check the backend is usable before anything is written to the ledger; raise
        BackendError if not."""

    def start(self) -> None:
        """Connect to (or start) the Ray that runs the trials."""
        raise NotImplementedError

    def job_ref_ahead(self, trial: Trial, attempt: int) -> str | None:
        """An attempt's job ref before it is launched, so that a first launch's run is
        created with it (one write less per trial): a Ray task's name. None where only the
        launch makes it (a SLURM job id)."""
        return job_ref("ray", f"{TASK_NAME}:{trial.trial_id}:{attempt}")

    def launch_many(
        self, items: list[tuple[Trial, TrialRecord, str | None]]
    ) -> list[tuple[Any, str]]:
        """Start trials, each named by its job ref ahead (`job_ref_ahead`); returns
        (handle, job_ref) per item."""
        import ray

        task = ray.remote(launch)
        placement = {
            "num_cpus": self.cfg.cpus_per_trial,
            "num_gpus": self.cfg.gpus_per_trial,
            "resources": dict(self.cfg.resources_per_trial) or None,
            "max_retries": 0,  # the scheduler retries, with backoff and a FAILED tag
        }
        out = []
        for trial, rec, ref in items:
            ref = ref or job_ref("ray", TASK_NAME)
            handle = task.options(**placement, name=ref.removeprefix("ray:")).remote(
                self.job, trial.job.model_dump_json(), rec.run_id, self.cfg.ranks,
                rec.artifact_uri, self.cfg.device_ask,
            )  # fmt: skip
            out.append((handle, ref))
        return out

    def cancel(self, handle: Any, rec: TrialRecord) -> None:
        import ray

        ray.cancel(handle, force=True)

    def stop(self) -> None:
        """Disconnect from Ray if this backend connected (a shared session stays up)."""
        import ray

        if self.owns_ray and ray.is_initialized():
            ray_shutdown()
