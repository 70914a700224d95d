"""Requeue a preempted SLURM trial in place: the same job id, the same MLflow run, and no
driver needed.

jobs.training.train handles the warning signals itself: SIGUSR2, which SLURM sends
`slurm.signal_delay_s` before the time limit (`--signal=USR2@...`, and at preemption where
the cluster sets `PreemptParameters=send_user_signal`), and SIGTERM, which it sends when it
preempts or requeues the job. The trainer checkpoints at the next step boundary and returns
PREEMPTED. submitit's own handler would stop it mid-step instead, so the trial asks SLURM
for the requeue submitit would have asked for (`scontrol requeue`), and every task then
ends without a result file: the watcher and the ledger's `job_ref` keep following the same
job id, and the requeued job runs the same submitted call, which resumes from the checkpoint.
"""

from __future__ import annotations

import logging
import os
import subprocess

log = logging.getLogger(__name__)


def requeueable(job_id: str) -> bool:
    """Whether SLURM may put this job back in the queue (`Requeue=1`: not `--no-requeue`,
    and the cluster's JobRequeue allows it)."""
    try:
        shown = subprocess.run(
            ["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return shown.returncode == 0 and "Requeue=1" in shown.stdout.split()


def requeue_in_place() -> bool:
    """Called by every task of a preempted trial's SLURM job. True when the job goes back
    to the queue under its id (the task must then end without a result); False outside
    SLURM or where the job may not be requeued (its PREEMPTED result then goes to the
    driver, which submits the trial again)."""
    if "SLURM_JOB_ID" not in os.environ:
        return False
    import submitit

    env = submitit.JobEnvironment()
    if not requeueable(env.job_id):  # '<array id>_<index>' for a task of a job array
        return False
    if env.global_rank != 0:  # the first task asks for the whole job
        return True
    asked = subprocess.run(
        ["scontrol", "requeue", env.job_id], capture_output=True, text=True, timeout=60
    )
    if asked.returncode != 0:  # SLURM requeues it already (a preemption, an admin's
        # `scontrol requeue`), or it is being cancelled: either way it ends here
        log.warning("scontrol requeue %s: %s", env.job_id, (asked.stderr or asked.stdout).strip())
    else:
        log.warning("SLURM job %s requeued in place after its checkpoint", env.job_id)
    return True
