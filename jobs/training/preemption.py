"""Preemption signals -> a checkpoint at the first step boundary after them, on every rank.

SLURM's warnings are SIGUSR2 (`--signal=USR2@<signal_delay_s>` before the time limit) and
SIGTERM (preemption, `scontrol requeue`, `scancel`): after a SIGTERM the job has KillWait
seconds (30 by default) before SIGKILL, and `scancel --signal=TERM` aborts the job step
KillWait + 2 s later. So the loop cannot wait for its next log step (minutes apart on a big
model) to notice the signal: it decides at every step boundary.

A checkpoint is a collective, so the ranks must decide together, also when the signal
reaches them at different steps (a launcher forwards it to each rank in turn). They vote
once per step: one all-reduce (MAX) of two integers over a CPU (gloo) group, the second
whether rank 0's clock says a progress line is due (jobs/training/progress.py), so the ranks
also read their losses back for it at the same step. Nothing is read back from the device,
so a GPU's queued kernels keep running (jobs/training/step_metrics.py: device values are
read only at sync steps).
"""

from __future__ import annotations

import signal
from typing import Any

import torch
import torch.distributed as dist

from scalelab.jobs.training.distributed import DistEnv

PREEMPT_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)


class PreemptionFlag:
    """Records SIGTERM / SIGUSR1 / SIGUSR2 while the loop runs (their handlers before it,
    e.g. submitit's, are back afterwards)."""

    def __init__(self) -> None:
        self.signal: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> PreemptionFlag:
        try:
            for sig in PREEMPT_SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        except ValueError:  # not the main thread (e.g. some Ray workers): no handlers
            self._previous.clear()
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        self.signal = signum

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    @property
    def raised(self) -> bool:
        return self.signal is not None


class PreemptionVote:
    """Whether any rank was signalled, and whether a progress line is due, the same answers
    on every rank. Created on every rank at the same point (the group is made collectively)."""

    def __init__(self, env: DistEnv) -> None:
        self.world_size = env.world_size
        self.group = dist.new_group(backend="gloo") if env.world_size > 1 else None

    def cast(self, flag: PreemptionFlag, report_due: bool = False) -> tuple[bool, bool]:
        """(any rank signalled, any rank's progress line due)."""
        if self.group is None:
            return flag.raised, report_due
        vote = torch.tensor([int(flag.raised), int(report_due)], dtype=torch.int32)
        dist.all_reduce(vote, op=dist.ReduceOp.MAX, group=self.group)
        raised, due = vote.tolist()
        return bool(raised), bool(due)
