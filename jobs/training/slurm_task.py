"""What a SLURM task inherited, told apart from what a launcher inside it set.

SLURM sets none of RANK, WORLD_SIZE and MASTER_PORT. Where they are in the environment
SLURM started the task with (its first process's, /proc/<SLURM_TASK_PID>/environ), they
came from the shell that submitted the job (sbatch passes its environment on, srun the
batch script's): an earlier torchrun's, say, the same in every task, and nothing to do
with this job. A launcher started inside the task (torchrun, the deepspeed launcher,
jobs/training/local_ranks.py) sets them for its ranks after SLURM started it, with other
values: those are the ranks' own.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

TASK_VARIABLES = ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_JOB_ID")


def in_task(env: Mapping[str, str]) -> bool:
    """Whether this process runs in a SLURM task (of srun, or a batch script)."""
    return all(key in env for key in TASK_VARIABLES)


def rank_from_launcher(env: Mapping[str, str]) -> bool:
    """Whether RANK and WORLD_SIZE are a launcher's for this process, not what a SLURM
    task inherited from the submitting shell (SLURM's own variables then say the rank)."""
    return "RANK" in env and "WORLD_SIZE" in env and not inherited(env, "RANK", "WORLD_SIZE")


def inherited(env: Mapping[str, str], *keys: str) -> bool:
    """Whether every one of `keys` has the value SLURM started this task with, i.e. the
    submitting shell's. False outside a SLURM task and where its start cannot be read."""
    start = start_environment(env)
    return start is not None and all(key in env and start.get(key) == env[key] for key in keys)


def start_environment(env: Mapping[str, str]) -> dict[str, str] | None:
    """The environment SLURM started this task with; None where it cannot be read (the
    task's first process in another PID namespace, /proc hidden) or is not this task's."""
    pid = env.get("SLURM_TASK_PID", "")
    if not in_task(env) or not pid.isdigit():
        return None
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    entries = raw.decode(errors="replace").split("\0")
    start = dict(entry.split("=", 1) for entry in entries if "=" in entry)
    same_task = all(start.get(key) == env.get(key) for key in (*TASK_VARIABLES, "SLURM_STEP_ID"))
    return start if same_task else None
