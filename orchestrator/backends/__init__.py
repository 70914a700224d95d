"""Where trials run. Every backend turns a claimed trial into a Ray ObjectRef that resolves
to an outcome dict ({'status': 'FINISHED'|'FAILED'|'PREEMPTED', 'reason': str|None}), so the
scheduler waits on all of them the same way (`ray.wait`).

  local : an embedded Ray on this machine (ray.init(address='local')), on 127.0.0.1 only
  ray   : an existing Ray cluster by address (cloud GPUs through its autoscaler)
  slurm : submitit -> sbatch; a Ray task with a fraction of a CPU watches each SLURM job
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from scalelab.jobs.launch import DEFAULT_JOB, JobRef
from scalelab.orchestrator.backends.base import Backend, BackendError, ray_init
from scalelab.orchestrator.backends.local import LocalBackend
from scalelab.orchestrator.backends.ray import RayClusterBackend
from scalelab.orchestrator.backends.slurm import SlurmBackend, check_slurm

if TYPE_CHECKING:
    from scalelab.orchestrator.ledger import Ledger
    from scalelab.orchestrator.plan.spec import BackendConfig


def preflight(cfg: BackendConfig) -> None:
    """Check the backend is usable before anything is written to the ledger."""
    if cfg.kind == "slurm":
        check_slurm()
    elif cfg.kind == "ray":
        ray_init(cfg.address, embedded=False)


def make_backend(cfg: BackendConfig, ledger: Ledger, job: JobRef = DEFAULT_JOB) -> Backend:
    if cfg.kind == "local":
        return LocalBackend(cfg, ledger, job)
    if cfg.kind == "ray":
        return RayClusterBackend(cfg, ledger, job)
    if cfg.kind == "slurm":
        return SlurmBackend(cfg, ledger, job)
    raise BackendError(f"unknown backend {cfg.kind!r}; allowed: local, ray, slurm")
