"""A trial's times and the state its views show, defined once for every view (`status`,
`sweeps`, the lines `submit` prints as trials end, `results query`, the report, MLflow):
its **run time**, the sum of its attempts' running times, each from its launch to its end
(a trial cancelled and submitted again, retried or preempted and requeued does not count
the time it waited between attempts; a trial that ran once: from its launch, when its run
was created (`Ledger.start_runs`), to its end, what MLflow's own Duration column shows);
its **queue time**, from its placeholder's creation at submit to its first launch
(docs/monitoring.md, 'Times'); and its **shown status**, its run's, but STARTING for a
SCHEDULED run whose latest attempt was launched and whose process does not run yet.
`duration_text` is the one way times are written.

The tags of an attempt: the scheduler tags each launch's time (`Tag.LAUNCHED`; the first
launch's is `Tag.STARTED` too) and, at a later launch, the running time of the attempts
before it (`Tag.EARLIER_S`); an attempt that ends while its run goes on (a retry waits, a
preempted trial is requeued) is tagged with its end (`Tag.ATTEMPT_ENDED`), where a run's
end time says when its last attempt ended. A trial is tagged with its whole run time when
it ends (`Tag.RUN_S`), for MLflow's table."""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

from scalelab.contract.runs import TERMINAL, Status, Tag


def run_seconds(
    tags: Mapping[str, str], status: str, end_ms: int | None, now_ms: float | None = None
) -> float | None:
    """The sum of the trial's attempts' running times, in seconds: the attempts before its
    latest, and the latest from its launch to its end (to now while it runs); None before
    it was launched."""
    launched = launch_ms(tags)
    if not launched:
        return None
    end = attempt_end_ms(tags, end_ms)
    if end is None:
        end = end_ms if status in TERMINAL and end_ms else now_ms or time.time() * 1000
    earlier = _number(tags.get(Tag.EARLIER_S)) or 0.0
    return max(round(earlier + (end - launched) / 1000, 1), 0.0)


def shown_status(status: str, tags: Mapping[str, str], end_ms: int | None) -> str:
    """The status every view shows: the run's, but STARTING while its latest attempt is
    launched and its process not running yet (the run turns RUNNING when the job starts);
    never written to MLflow."""
    if status == Status.SCHEDULED and Tag.LAUNCHED in tags and attempt_end_ms(tags, end_ms) is None:
        return Status.STARTING
    return status


def launch_ms(tags: Mapping[str, str]) -> float | None:
    """Epoch ms of the trial's latest launch (its first, on runs launched once or before
    attempts were tagged); None before it was launched."""
    return parse_timestamp(tags.get(Tag.LAUNCHED)) or started_ms(tags)


def attempt_end_ms(tags: Mapping[str, str], end_ms: int | None) -> float | None:
    """Epoch ms of the end of the trial's latest attempt: its run's end, or the end tagged
    where the run went on (`Tag.ATTEMPT_ENDED`); None while that attempt has not ended. A
    run submitted again keeps its earlier end time (an open status keeps it) until it ends
    again, which is before its latest launch."""
    launched = launch_ms(tags)
    ends = [e for e in (parse_timestamp(tags.get(Tag.ATTEMPT_ENDED)), end_ms) if e]
    end = max(ends, default=None)
    return end if launched and end is not None and end >= launched else None


def next_attempt_tags(tags: Mapping[str, str], end_ms: int | None, now_ms: int) -> dict[str, str]:
    """The tags of a trial's later launch at `now_ms`: its time, and the running time of
    the attempts before it. An earlier attempt with no recorded end (its driver stopped
    while it ran) adds nothing: when it ended is not known."""
    earlier = _number(tags.get(Tag.EARLIER_S)) or 0.0
    launched, end = launch_ms(tags), attempt_end_ms(tags, end_ms)
    if launched and end is not None:
        earlier += (end - launched) / 1000
    return {Tag.LAUNCHED: timestamp_text(now_ms), Tag.EARLIER_S: f"{earlier:.1f}"}


def attempt_end_tags(tags: Mapping[str, str], run_status: str, now_ms: int) -> dict[str, str]:
    """The tags of a trial's attempt that ended at `now_ms`, its run then `run_status`: the
    attempt's end where the run goes on (a retry, a requeue), which the run's end time does
    not say; where the run ends, its whole run time, a column of the MLflow UI's saved view
    beside MLflow's Duration (which counts from the first launch, waits included)."""
    if run_status not in TERMINAL:
        return {Tag.ATTEMPT_ENDED: timestamp_text(now_ms)}
    return {Tag.RUN_S: f"{run_seconds(tags, run_status, now_ms):.1f}"}


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
