"""Numbers as strict JSON (`--json`): no NaN or inf leaks, 'inf' and 'nan' are strings
('inf' = never reached), every estimate with its interval."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from scalelab.analysis.scaling import Bootstrap


def num(x: Any) -> Any:
    """JSON-safe: inf/nan become strings, numpy scalars Python numbers."""
    if isinstance(x, (float, np.floating)):
        return float(x) if math.isfinite(x) else str(float(x))
    if isinstance(x, np.integer):
        return int(x)
    return x


def interval(i: Any) -> dict[str, Any]:
    return {"estimate": num(i.estimate), "low": num(i.low), "high": num(i.high), "level": i.level}


def boot(b: Bootstrap) -> dict[str, Any]:
    out: dict[str, Any] = {k: interval(v) for k, v in b.intervals.items()}
    out["n_trials"] = b.point.n_trials
    out["resamples_ok"] = b.n_resamples - b.n_failed
    return out
