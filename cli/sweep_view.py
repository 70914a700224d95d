"""What a person watching a sweep sees in the terminal: a line per trial as it ends with an
ETA, the failures with where their logs are, and `status`'s rows (the swept settings,
tokens, learning rate, loss, duration, the error's tail) as cells."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from scalelab.contract import workdir as paths
from scalelab.orchestrator.trial_names import run_names, short_count, short_value

if TYPE_CHECKING:
    from rich.console import Console

    from scalelab.orchestrator.expand import Trial
    from scalelab.orchestrator.trial_status import Failure

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


def failure_lines(failures: tuple[Failure, ...], sweep: str) -> list[str]:
    """Each failed trial: its name and id, attempts, the error's tail, and where its log is."""
    lines = []
    for f in failures:
        how = "diverged" if f.diverged else "failed"
        error = error_tail(f.error) or "no reason recorded"
        lines.append(f"  {f.name} ({f.trial_id}) {how} after {f.attempts} attempt(s): {error}")
        lines.append(f"    log: {f.log}  (scalelab logs {sweep} {f.trial_id[:8]})")
    return lines


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
