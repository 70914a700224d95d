"""A trial's two times, defined once for every view (`status`, the lines `submit` prints as
trials end, `results query`, the report, MLflow): its **run time**, from its launch (its run
is created then: `Ledger.start_run`) to its end, retries included, and so what MLflow's own
Duration column shows; and its **queue time**, from its placeholder's creation at submit to
that launch (docs/monitoring.md, 'Times'). `duration_text` is the one way they are written."""

from __future__ import annotations

import time
from collections.abc import Mapping

from scalelab.contract.runs import TERMINAL, Tag


def run_seconds(
    tags: Mapping[str, str], status: str, end_ms: int | None, now_ms: float | None = None
) -> float | None:
    """Seconds from the trial's launch to its end (to now while it is not over); None
    before it was launched."""
    started = _number(tags.get(Tag.STARTED_MS))
    if not started:
        return None
    end = end_ms if status in TERMINAL and end_ms else now_ms or time.time() * 1000
    return max(round((end - started) / 1000, 1), 0.0)


def queued_seconds(tags: Mapping[str, str]) -> float | None:
    """Seconds from the submit that scheduled the trial to its launch; None before it."""
    return _number(tags.get(Tag.QUEUED_S))


def duration_text(seconds: float | None) -> str:
    """'34s', '1m10s', '2h05m'; '' for no time."""
    if seconds is None or seconds != seconds or seconds < 0:
        return ""
    minutes, s = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{s:02d}s" if minutes else f"{s}s"


def _number(text: str | None) -> float | None:
    try:
        return float(text) if text else None
    except ValueError:
        return None
