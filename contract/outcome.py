"""How a trial's process ends, for every launcher (docs/architecture.md, 'MLflow schema')."""

from __future__ import annotations

import json
from typing import Any, Literal

from scalelab.contract import workdir
from scalelab.contract.runs import Status

Ending = Literal["FINISHED", "FAILED", "PREEMPTED"]  # how a job's run() ends (Status values)

EXIT_REQUEUE = 75  # EX_TEMPFAIL: "requeue me", for every backend
_EXIT_CODES = {Status.FINISHED: 0, Status.FAILED: 1, Status.PREEMPTED: EXIT_REQUEUE}


def exit_code(status: str) -> int:
    """The process exit code of a job that ended with `status`."""
    return _EXIT_CODES[status]


# EX_CONFIG (sysexits.h): the node cannot run the trial as placed (no CUDA, too few GPUs).
# Deterministic on that node and software: the scheduler does not retry it blindly.
EXIT_REFUSED = 78


class EnvironmentRefused(ValueError):
    """The node or its software cannot run the trial as its placement asks; the message
    names what was found and what to change. Raised before any process group or run."""


def trained(trial_id: str) -> dict[str, Any] | None:
    """The trial's result.json when it says the training finished (under any run), else
    None (not finished, or its folder is not on this machine)."""
    path = workdir.trial_dir(trial_id) / workdir.RESULT_FILE
    try:
        result = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return result if result.get("status") == Status.FINISHED else None
