"""What a person watching a sweep sees in the terminal: a line per trial as it ends with an
ETA, the failures with where their logs are, and `status`'s rows (the swept settings,
tokens, learning rate, loss, duration, the error's tail)."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from scalelab.contract import workdir as paths
from scalelab.contract.runs import TERMINAL, Tag
from scalelab.orchestrator.trial_names import run_names, short_count, short_value

if TYPE_CHECKING:
    from rich.console import Console

    from scalelab.orchestrator.expand import Trial
    from scalelab.orchestrator.ledger import Ledger, TrialRecord

ERROR_CHARS = 240  # of an error, in a table cell or a failure line: its end, where Python's is


def error_tail(text: str, chars: int = ERROR_CHARS) -> str:
    """An error on one line, cut from the front when long (the cause is at the end)."""
    flat = " ".join(line.strip() for line in text.strip().splitlines() if line.strip())
    return flat if len(flat) <= chars else "…" + flat[-(chars - 1) :]


def duration(seconds: float | None) -> str:
    if seconds is None or seconds < 0:
        return ""
    minutes, s = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{s:02d}s" if minutes else f"{s}s"


def read_result(trial_id: str) -> dict[str, Any]:
    path = paths.trial_dir(trial_id) / paths.RESULT_FILE
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


class TrialLines:
    """One printed line per trial as it ends (name, tokens, final loss, time) and the ETA
    of the rest, from the plan's FLOPs and the FLOPs done so far per second."""

    def __init__(self, console: Console, trials: list[Trial], already_done: set[str]) -> None:
        self.console = console
        self.trials = {t.trial_id: t for t in trials}
        self.names = run_names(trials)
        self.to_run = sum(t.flops for t in trials if t.trial_id not in already_done)
        self.done_flops = 0.0
        self.t0 = time.monotonic()

    def ended(self, trial_id: str, outcome: str) -> None:
        t = self.trials[trial_id]
        self.done_flops += t.flops
        result = read_result(trial_id)
        loss = result.get("final_val_loss")
        parts = [
            f"{self.names[trial_id]:<28}",
            f"{outcome:<8}",
            f"{short_count(t.tokens)} tokens",
            f"val loss {loss:.4f}" if isinstance(loss, float) else "",
            duration(result.get("wall_time_s")),
        ]
        if outcome in ("failed", "diverged"):
            parts.append(f"log: {paths.trial_log(trial_id)}")
        self.console.print("  ".join(p for p in parts if p), highlight=False, soft_wrap=True)

    def eta(self) -> str:
        """'ETA 3m10s' once a trial has ended, from the FLOPs per second so far."""
        elapsed = time.monotonic() - self.t0
        left = self.to_run - self.done_flops
        if self.done_flops <= 0 or left <= 0:
            return ""
        return f"ETA {duration(elapsed * left / self.done_flops)}"


def failure_lines(ledger: Ledger, failed: list[str], sweep: str) -> list[str]:
    """Each failed trial: its name and id, attempts, the error's tail, and where its log is."""
    records = {r.trial_id: r for r in ledger.records().values()}
    lines = []
    for tid in failed:
        rec = records.get(tid)
        tags = rec.tags if rec else {}
        how = "diverged" if tags.get(Tag.DIVERGED) == "1" else "failed"
        attempts = rec.attempts if rec else 0
        error = error_tail(tags.get(Tag.ERROR, "")) or "no reason recorded"
        name = rec.name if rec else tid
        lines.append(f"  {name} ({tid}) {how} after {attempts} attempt(s): {error}")
        lines.append(f"    log: {paths.trial_log(tid)}  (scalelab logs {sweep} {tid[:8]})")
    return lines


def status_row(rec: TrialRecord, error: str) -> dict[str, Any]:
    """One trial of `status`: what it is (name, swept settings, tokens, lr), where it is, and
    how it went (loss, duration without the time queued, attempts, error)."""
    started = int(rec.tags.get(Tag.STARTED_MS, "0") or 0)
    ended = rec.end_time if rec.status in TERMINAL else 0
    seconds = (ended or time.time() * 1000) - started if started else None
    return {
        "trial_id": rec.trial_id,
        "run_id": rec.run_id,
        "name": rec.name,
        "variant": rec.tags.get(Tag.VARIANT, ""),
        "size": rec.tags.get(Tag.SIZE, ""),
        "swept": json.loads(rec.tags.get(Tag.SWEPT, "{}") or "{}"),
        "tokens": _int(rec.tags.get(Tag.TOKENS) or rec.params.get("train.tokens")),
        "lr": _float(rec.params.get("train.lr")),
        "val_loss": rec.metrics.get("val/loss"),
        "duration_s": None if seconds is None else round(seconds / 1000, 1),
        "queued_s": _float(rec.tags.get(Tag.QUEUED_S)),
        "status": rec.status,
        "diverged": rec.tags.get(Tag.DIVERGED) == "1",
        "attempts": rec.attempts,
        "job_ref": rec.tags.get(Tag.JOB_REF, ""),
        "error": error,
        "log": str(paths.trial_log(rec.trial_id)) if error else "",
    }


def status_cells(row: dict[str, Any]) -> list[str]:
    """The table's cells of a status_row, in STATUS_COLUMNS order."""
    loss = row["val_loss"]
    swept = " ".join(f"{k.rsplit('.', 1)[-1]}={short_value(v)}" for k, v in row["swept"].items())
    status = "DIVERGED" if row["diverged"] else row["status"]
    error = error_tail(row["error"])
    return [
        row["trial_id"],
        row["variant"],
        row["size"],
        swept,
        short_count(row["tokens"]) if row["tokens"] is not None else "",
        f"{row['lr']:.3g}" if row["lr"] is not None else "",
        f"{loss:.4f}" if loss is not None else "",
        duration(row["duration_s"]),
        status,
        str(row["attempts"]),
        f"{error}\nlog: {row['log']}" if error and row["log"] else error,
    ]


STATUS_COLUMNS = (
    "trial_id", "variant", "size", "swept", "tokens", "lr", "val loss", "time", "status",
    "attempts", "error",
)  # fmt: skip


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text else None
    except ValueError:
        return None


def _float(text: str | None) -> float | None:
    try:
        return float(text) if text else None
    except ValueError:
        return None
