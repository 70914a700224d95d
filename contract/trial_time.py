"""A trial's two times, defined once for every view (`status`, the lines `submit` prints as
trials end, `results query`, the report, MLflow): its **run time**, from its launch (its run
is created then: `Ledger.start_run`) to its end, retries included, and so what MLflow's own
Duration column shows; and its **queue time**, from its placeholder's creation at submit to
that launch (docs/monitoring.md, 'Times'). `duration_text` is the one way they are written."""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

from scalelab.contract.runs import TERMINAL, Tag


def run_seconds(
    tags: Mapping[str, str], status: str, end_ms: int | None, now_ms: float | None = None
) -> float | None:
    """Seconds from the trial's launch to its end (to now while it is not over); None
    before it was launched."""
    started = started_ms(tags)
    if not started:
        return None
    end = end_ms if status in TERMINAL and end_ms else now_ms or time.time() * 1000
    return max(round((end - started) / 1000, 1), 0.0)


def timestamp_text(epoch_ms: int) -> str:
    """'2026-12-02T23:45:01.123Z': how a time is written in a tag, read by people in the
    MLflow UI and by `parse_timestamp`."""
    moment = datetime.fromtimestamp(epoch_ms / 1000, tz=timezone.utc)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse_timestamp(text: str | None) -> float | None:
    """Epoch ms of a `timestamp_text`; None for anything else."""
    if not text:
        return None
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment.timestamp() * 1000 if moment.tzinfo else None


def started_ms(tags: Mapping[str, str]) -> float | None:
    """Epoch ms of the trial's launch (`Tag.STARTED`, or the epoch-ms tag of older runs);
    None before it was launched."""
    return parse_timestamp(tags.get(Tag.STARTED)) or _number(tags.get(Tag.STARTED_MS))


def launched(tags: Mapping[str, str]) -> bool:
    """Whether the run is a launched trial's, not the placeholder made at submit."""
    return Tag.STARTED in tags or Tag.STARTED_MS in tags


def trial_run_rank(run: Any) -> tuple[bool, int, str]:
    """Where a run stands among its trial's runs; the first is the trial's run for every
    reader (the ledger, `results sync`, `eval`): a launched run before a placeholder a driver
    stopped in start_run left behind, then the oldest, the winner of a creation race."""
    return not launched(run.data.tags), run.info.start_time or 0, run.info.run_id


def queued_seconds(tags: Mapping[str, str]) -> float | None:
    """Seconds from the submit that scheduled the trial to its launch; None before it."""
    return _number(tags.get(Tag.QUEUED_S))


def duration_text(seconds: float | None) -> str:
    """'34s', '1m10s', '2h05m', '3d04h'; '' for no time."""
    if seconds is None or seconds != seconds or seconds < 0:
        return ""
    minutes, s = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    days, hours_of_day = divmod(hours, 24)
    if days >= 2:
        return f"{days}d{hours_of_day:02d}h"
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{s:02d}s" if minutes else f"{s}s"


def _number(text: str | None) -> float | None:
    try:
        return float(text) if text else None
    except ValueError:
        return None
