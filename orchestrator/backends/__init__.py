"""Where trials run. Every backend turns a claimed trial into a Ray ObjectRef that resolves
to an outcome dict ({'status': 'FINISHED'|'FAILED'|'PREEMPTED', 'reason': str|None}), so the
scheduler waits on all of them the same way (`ray.wait`).

  local : an embedded Ray on this machine (ray.init(address='local')), on 127.0.0.1 only
  ray   : an existing Ray cluster by address (cloud GPUs through its autoscaler)
  slurm : submitit -> sbatch; a Ray task with a fraction of a CPU watches each SLURM job

Each is one module (its options class and its Backend), registered by kind in
orchestrator/backends/registry.py, where another backend is registered too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from scalelab.jobs.launch import DEFAULT_JOB, JobRef
from scalelab.orchestrator.backends.base import Backend, BackendError, BackendOptions, ray_init
from scalelab.orchestrator.backends.registry import backend_class, register, registered

if TYPE_CHECKING:
    from scalelab.orchestrator.ledger import Ledger

__all__ = [
    "Backend",
    "BackendError",
    "BackendOptions",
    "make_backend",
    "preflight",
    "ray_init",
    "register",
    "registered",
]


def preflight(cfg: BackendOptions) -> None:
    """Check the backend is usable before anything is written to the ledger."""
    backend_class(cfg.kind).preflight(cfg)


def make_backend(cfg: BackendOptions, ledger: Ledger, job: JobRef = DEFAULT_JOB) -> Backend:
    return backend_class(cfg.kind)(cfg, ledger, job)
