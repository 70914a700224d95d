"""One acceptance check's outcome, and the small rules the checks share."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Status = Literal["pass", "fail", "skipped"]
NO_GPU = "not measured: no GPU"
MEMORY_REL = 0.10  # the planner's stated accuracy (orchestrator/plan/memory.py)


@dataclass(frozen=True)
class Check:
    name: str
    goal: str  # what passing means, with its numbers
    status: Status
    measured: str  # what ran here; a part that could not run says why


def verdict(ok: bool) -> Status:
    return "pass" if ok else "fail"


def within(measured: float, estimate: float, rel: float) -> bool:
    """|measured - estimate| <= rel x measured: the estimate is off by at most `rel` of
    what was measured."""
    return abs(measured - estimate) <= rel * measured


def memory(n: float) -> str:
    """Bytes in GiB, or MiB below one GiB (the CPU path's models are small)."""
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.2f} MiB"
