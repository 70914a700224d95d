"""How a trial's process ends, for every launcher (docs/architecture.md, 'MLflow schema')."""

from __future__ import annotations

from typing import Literal

from scalelab.contract.runs import Status

Ending = Literal["FINISHED", "FAILED", "PREEMPTED"]  # how a job's run() ends (Status values)

EXIT_REQUEUE = 75  # EX_TEMPFAIL: "requeue me", for every backend
_EXIT_CODES = {Status.FINISHED: 0, Status.FAILED: 1, Status.PREEMPTED: EXIT_REQUEUE}


def exit_code(status: str) -> int:
    """The process exit code of a job that ended with `status`."""
    return _EXIT_CODES[status]
