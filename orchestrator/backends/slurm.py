"""slurm: submitit -> sbatch, one job per trial or job arrays for many small trials.

The driver submits (so the SLURM job id is recorded in MLflow as `scalelab.job_ref` at
once); a Ray task with a fraction of a CPU then watches each job until it ends. A driver
started again finds the job id in MLflow and re-attaches instead of submitting twice.
Preemption and time limits: the job checkpoints on SLURM's warning signal and requeues
itself in place (orchestrator/backends/requeue.py): the same job id, the same arguments
(the same run id), not a retry, with or without a driver.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterable
from functools import cache
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, field_validator, model_validator

from scalelab.contract import workdir
from scalelab.contract.config import FrozenConfig
from scalelab.contract.outcome import EXIT_REFUSED, EXIT_REQUEUE
from scalelab.contract.placement import DeviceAsk
from scalelab.contract.runs import Status, Tag, job_ref
from scalelab.jobs.launch import JobRef, launch
from scalelab.orchestrator.backends.base import Backend, BackendError, BackendOptions, ray_init

if TYPE_CHECKING:
    from scalelab.orchestrator.ledger import TrialRecord
    from scalelab.orchestrator.plan.expand import Trial

# submitit's own handler (for a signal that comes before or after the training loop) stops
# requeueing a trial after this many time-outs; the trial's step budget ends it instead.
MAX_TIME_LIMIT_SLICES = 10_000
ACTIVE = {"PENDING", "RUNNING", "REQUEUED", "RESIZING", "SUSPENDED", "CONFIGURING", "COMPLETING"}
WATCHER_CPUS = 0.05


class SlurmSettings(FrozenConfig):
    """`backend.slurm`: submitit's AutoExecutor parameters (placement only: never part of a
    trial's id)."""

    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time_min: int = Field(60, ge=1, description="wall-clock limit per job, minutes")
    signal_delay_s: int = Field(
        180,
        ge=10,
        description="SLURM's warning signal comes this many seconds before the time limit: "
        "time to finish the step and write a checkpoint, then the job requeues itself",
    )
    nodes: int = Field(1, ge=1)
    gpus_per_node: int = Field(0, ge=0)
    tasks_per_node: int = Field(1, ge=1)
    cpus_per_task: int = Field(1, ge=1)
    mem_gb: float | None = Field(None, gt=0)
    constraint: str | None = None
    extra_sbatch: list[str] = Field(
        default_factory=list, description="raw '#SBATCH' lines, e.g. '--exclusive'"
    )
    array: bool | None = Field(
        None, description="job arrays: None = when several small (single-node) trials wait"
    )
    array_parallelism: int = Field(64, ge=1)
    max_array_size: int | None = Field(
        None, ge=1, description="default: the cluster's MaxArraySize (scontrol show config)"
    )
    poll_s: float = Field(5.0, gt=0, description="how often a watcher polls its job")

    @model_validator(mode="after")
    def _warning_within_the_limit(self) -> SlurmSettings:
        if self.signal_delay_s >= self.time_min * 60:
            raise ValueError(
                f"signal_delay_s ({self.signal_delay_s}) must be shorter than time_min "
                f"({self.time_min} min = {self.time_min * 60} s)"
            )
        return self


class SlurmOptions(BackendOptions):
    """`backend: {kind: slurm, slurm: {...}, ...}`: one SLURM job per trial, its nodes and
    tasks (one rank each) from `slurm`."""

    kind: Literal["slurm"] = "slurm"
    slurm: SlurmSettings = SlurmSettings()

    @field_validator("slurm", mode="before")
    @classmethod
    def _unset_is_default(cls, value: Any) -> Any:
        return SlurmSettings() if value is None else value  # `slurm:` with nothing under it

    @property
    def nodes(self) -> int:
        return self.slurm.nodes

    @property
    def ranks_per_node(self) -> int:
        return self.slurm.tasks_per_node

    @property
    def gpus_per_node(self) -> float:
        return self.slurm.gpus_per_node

    @property
    def host_bytes_per_node(self) -> int | None:
        return int(self.slurm.mem_gb * 1e9) if self.slurm.mem_gb else None

    @property
    def device(self) -> str | None:
        return None  # the node decides

    @property
    def device_ask(self) -> DeviceAsk:
        """The node's GPUs (`gpus_per_node`, or any GPU where only `gpu` names one)."""
        return DeviceAsk(self.slurm.gpus_per_node, self.gpu)

    @property
    def time_limit_s(self) -> float | None:
        return self.slurm.time_min * 60

    @property
    def nodes_key(self) -> str | None:
        return "backend.slurm.nodes"

    def writers_elsewhere(self) -> str | None:
        return "the SLURM jobs write it from their compute nodes"


def check_slurm(timeout_s: float = 15.0) -> None:
    """Raise BackendError unless sbatch exists and slurmctld answers."""
    if shutil.which("sbatch") is None or shutil.which("scontrol") is None:
        raise BackendError("SLURM is not reachable: sbatch/scontrol are not on PATH")
    try:
        ping = subprocess.run(
            ["scontrol", "ping"], capture_output=True, text=True, timeout=timeout_s
        )
    except subprocess.TimeoutExpired:
        raise BackendError(
            f"SLURM is not reachable: 'scontrol ping' timed out ({timeout_s}s)"
        ) from None
    if ping.returncode != 0 or "UP" not in ping.stdout:
        detail = (ping.stdout + ping.stderr).strip().splitlines()
        raise BackendError(
            f"SLURM is not reachable: {detail[-1] if detail else 'scontrol ping failed'}"
        )


@cache
def slurm_job_ids(records: Iterable[TrialRecord]) -> list[str]:
    """The SLURM job ids of the records' latest attempts (tag scalelab.job_ref 'slurm:ID')."""
    refs = (r.tags.get(Tag.JOB_REF, "") for r in records)
    return [ref.removeprefix("slurm:") for ref in refs if ref.startswith("slurm:")]


def cancel_jobs(job_ids: list[str]) -> None:
    """scancel the jobs (a job already gone is no error)."""
    if job_ids:
        subprocess.run(["scancel", *job_ids], check=False, capture_output=True)


def max_array_size() -> int:
    """The cluster's MaxArraySize (array indices go 0 .. MaxArraySize-1)."""
    try:
        text = subprocess.run(
            ["scontrol", "show", "config"], capture_output=True, text=True, timeout=15
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 1000
    for line in text.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "MaxArraySize" and value.strip().isdigit():
            return int(value.strip())
    return 1001


def sbatch_extras(lines: list[str]) -> dict[str, Any]:
    """['--exclusive', '--reservation=x'] -> {'exclusive': True, 'reservation': 'x'}."""
    extra: dict[str, Any] = {}
    for line in lines:
        flag = line.strip().removeprefix("#SBATCH").strip().lstrip("-")
        key, sep, value = flag.partition("=")
        extra[key.strip().replace("-", "_")] = value.strip() if sep else True
    return extra


class SlurmTrial:
    """What runs inside the SLURM job: a trial that requeues its job in place when it was
    preempted (after its checkpoint); Checkpointable, so a signal that comes while the trial
    is not in its training loop is handled by submitit, which requeues it unchanged."""

    def __call__(
        self,
        job_ref: JobRef,
        job_json: str,
        run_id: str | None,
        artifact_uri: str = "",
        ask: DeviceAsk | None = None,
    ) -> dict[str, Any]:
        from scalelab.jobs.environ import node_local_triton_cache
        from scalelab.orchestrator.backends.requeue import requeue_in_place

        node_local_triton_cache()  # before any kernel compiles, for every rank it starts
        outcome = launch(job_ref, job_json, run_id, artifact_uri=artifact_uri, ask=ask)
        if outcome["status"] == Status.PREEMPTED and requeue_in_place():
            raise SystemExit(EXIT_REQUEUE)  # no result file: watchers wait for the requeued run
        if outcome.get("refused") and int(os.environ.get("SLURM_NTASKS", "1")) > 1:
            record_refusal(outcome)
            raise SystemExit(EXIT_REFUSED)  # srun --kill-on-bad-exit ends the waiting tasks
        return outcome

    def checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        import submitit

        return submitit.helpers.DelayedSubmission(self, *args, **kwargs)


def slurm_client_options() -> dict[str, Any]:
    """Ray options that point the watchers' sacct at the driver's cluster: SLURM_CONF names
    it where there are several (a Ray worker does not inherit the driver's environment, and
    another cluster's job of the same id would be taken for ours)."""
    conf = os.environ.get("SLURM_CONF")
    return {"runtime_env": {"env_vars": {"SLURM_CONF": conf}}} if conf else {}


# A task that refused its node, in a job of several tasks: its outcome, beside submitit's
# files. The exit code alone (78) does not survive: the step's is that of the tasks srun
# then kills (sacct shows CANCELLED 0:15), and task 0 leaves no result.
REFUSAL_FILE = "{job_id}_{task}_refused.json"


def record_refusal(outcome: dict[str, Any]) -> None:
    """In a SLURM task that refused its node: leave its outcome for the job's watcher."""
    import submitit

    env = submitit.JobEnvironment()
    path = env.paths.folder / REFUSAL_FILE.format(job_id=env.job_id, task=env.global_rank)
    reason = f"task {env.global_rank} of {env.num_tasks} refused its node: {outcome['reason']}"
    path.write_text(json.dumps({**outcome, "reason": reason}))


def refusal(folder: str, job_id: str) -> dict[str, Any] | None:
    """The outcome a refusing task of the job recorded (the lowest task's), if one did."""
    import submitit

    job_folder = submitit.core.utils.JobPaths(folder, job_id=job_id).folder
    found = sorted(job_folder.glob(REFUSAL_FILE.format(job_id=job_id, task="*")),
                   key=lambda p: int(p.name.split("_")[-2]))  # fmt: skip
    for path in found:
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            continue
    return None


def watch_slurm(folder: str, job_id: str, poll_s: float) -> dict[str, Any]:
    """Wait for one SLURM job; its outcome dict, or FAILED with the reason."""
    import submitit

    job = submitit.SlurmJob(folder=folder, job_id=job_id)
    while not job.done():
        time.sleep(poll_s)
    if refused := refusal(folder, job_id):
        return refused  # not retried (orchestrator/scheduler.py)
    try:
        return job.result()
    except Exception as e:  # job failed, was cancelled, or left no result
        state = job.state
        if state.startswith("CANCELLED"):
            return {"status": Status.KILLED, "reason": f"SLURM job {job_id}: {state}"}
        lines = str(e).strip().splitlines()
        return {
            "status": Status.FAILED,
            "reason": f"SLURM job {job_id} {state}: " + "\n".join(lines[-15:]),
        }


class SlurmBackend(Backend):
    kind = "slurm"
    options = SlurmOptions

    @classmethod
    def preflight(cls, cfg: SlurmOptions) -> None:
        check_slurm()

    def start(self) -> None:
        check_slurm()
        # only the watchers run in Ray, one per trial in flight
        self.owns_ray = ray_init("local", embedded=True, workers=self.cfg.concurrency)
        self.folder = str(workdir.scalelab_home() / "slurm" / self.ledger.sweep / "%j")

    def _executor(self) -> Any:
        import submitit

        opts = self.cfg.slurm
        ex = submitit.AutoExecutor(
            folder=self.folder, cluster="slurm", slurm_max_num_timeout=MAX_TIME_LIMIT_SLICES
        )
        params: dict[str, Any] = {
            "timeout_min": opts.time_min,
            "slurm_signal_delay_s": opts.signal_delay_s,
            "nodes": opts.nodes,
            "tasks_per_node": opts.tasks_per_node,
            "cpus_per_task": opts.cpus_per_task,
            "slurm_array_parallelism": opts.array_parallelism,
            "name": f"scalelab-{self.ledger.sweep}",
            # one task failing ends the step: the others would wait at the rendezvous for
            # deepspeed.dist_timeout_minutes (a rank that refused its node, a port taken)
            "slurm_srun_args": ["--kill-on-bad-exit=1"],
        }
        if opts.gpus_per_node:
            params["gpus_per_node"] = opts.gpus_per_node
        if opts.mem_gb:
            params["mem_gb"] = opts.mem_gb
        for key in ("partition", "account", "qos", "constraint"):
            if getattr(opts, key):
                params[f"slurm_{key}"] = getattr(opts, key)
        if opts.extra_sbatch:
            params["slurm_additional_parameters"] = sbatch_extras(opts.extra_sbatch)
        ex.update_parameters(**params)
        return ex

    def _reattach(self, rec: TrialRecord) -> str | None:
        """The SLURM job id of a trial whose job still exists (a previous driver's)."""
        import submitit

        ref = rec.tags.get(Tag.JOB_REF, "")
        if not ref.startswith("slurm:"):
            return None
        job_id = ref.removeprefix("slurm:")
        state = submitit.SlurmJob(folder=self.folder, job_id=job_id).state
        return job_id if state in ACTIVE or state == "COMPLETED" else None

    def job_ref_ahead(self, trial: Trial, attempt: int) -> str | None:
        return None  # the SLURM job id, known once submitted

    def launch_many(
        self, items: list[tuple[Trial, TrialRecord, str | None]]
    ) -> list[tuple[Any, str]]:
        import ray

        job_ids: list[str | None] = [self._reattach(rec) for _, rec, _ in items]
        fresh = [i for i, jid in enumerate(job_ids) if jid is None]
        if fresh:
            ex, opts = self._executor(), self.cfg.slurm
            use_array = (
                opts.array if opts.array is not None else (len(fresh) > 1 and opts.nodes == 1)
            )
            chunk = (
                min(max_array_size(), opts.max_array_size or max_array_size()) if use_array else 1
            )
            for start in range(0, len(fresh), chunk):
                group = fresh[start : start + chunk]
                args = [
                    (self.job, items[i][0].job.model_dump_json(), items[i][1].run_id,
                     items[i][1].artifact_uri, self.cfg.device_ask)
                    for i in group
                ]  # fmt: skip
                if len(group) > 1:
                    with ex.batch():
                        jobs = [ex.submit(SlurmTrial(), *a) for a in args]
                else:
                    jobs = [ex.submit(SlurmTrial(), *args[0])]
                for i, job in zip(group, jobs, strict=True):
                    job_ids[i] = job.job_id
        watcher = ray.remote(watch_slurm).options(
            num_cpus=WATCHER_CPUS, max_retries=3, **slurm_client_options()
        )
        poll = self.cfg.slurm.poll_s
        return [(watcher.remote(self.folder, jid, poll), job_ref("slurm", jid)) for jid in job_ids]

    def cancel(self, handle: Any, rec: TrialRecord) -> None:
        import ray

        cancel_jobs(slurm_job_ids([rec]))
        ray.cancel(handle, force=True)
