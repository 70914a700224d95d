"""Progress lines in the trial's log while it trains (docs/monitoring.md, "A trial's log").

One line per report, `key=value` fields after a timestamp, on every rank, through the
`scalelab.jobs.training.progress` logger to file descriptor 2: the rank's log while jobs.launch captures
it (rank 0's `trial.log`, rank r's `rank<r>.log`), the terminal when the job runs by hand.
Written with one unbuffered write per line, so `scalelab logs --follow` shows it at once.

A line is written after the attempt's first step, after its last (the budget reached, or a
preemption's checkpoint), and in between whenever `train.progress_interval_s` seconds of
wall time have passed on rank 0 since the last line: the ranks learn it in the step's
preemption vote (jobs/training/preemption.py), so they all read their losses back at the
same step. Rates count this attempt only: a resumed trial's tokens/s and ETA start from
the step it resumed at.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass

from scalelab.jobs.training.accounting import mfu
from scalelab.jobs.training.step_metrics import Reduced

LOGGER = __name__  # scalelab.jobs.training.progress
TIME_FORMAT = "%Y-%m-%d %H:%M:%S"


class _Fd2:
    """A stream onto file descriptor 2 itself, not sys.stderr: the trial's log is whatever
    fd 2 is (jobs/tracking/trial_logs.py), whoever replaced sys.stderr in this process."""

    def write(self, text: str) -> None:
        os.write(2, text.encode())

    def flush(self) -> None:
        pass


def progress_logger() -> logging.Logger:
    log = logging.getLogger(LOGGER)
    if not log.handlers:
        handler = logging.StreamHandler(_Fd2())
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", TIME_FORMAT))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False  # an application's root handlers would print it twice
    return log


def duration(seconds: float) -> str:
    """0.42s, 12.3s, 4m05s, 2h07m."""
    if seconds < 10:
        return f"{seconds:.2f}s"
    if seconds < 60:
        return f"{seconds:.1f}s"
    s = round(seconds)
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


@dataclass(frozen=True)
class ProgressLine:
    step: int
    steps: int
    tokens: int
    loss: float  # mean train/loss over the steps since the previous line
    lr: float
    tokens_per_s: float  # since the previous line (this attempt's first: since it started)
    mfu: float | None  # None without a known device peak (CPU, an unlisted GPU)
    elapsed_s: float  # since this attempt's loop started
    eta_s: float  # steps left at this attempt's mean time per step

    def text(self) -> str:
        rate = (
            f"{self.tokens_per_s:.0f}" if self.tokens_per_s >= 100 else f"{self.tokens_per_s:.3g}"
        )
        fields = [
            f"step={self.step}/{self.steps}",
            f"tokens={self.tokens}",
            f"loss={self.loss:.4f}",
            f"lr={self.lr:.3g}",
            f"tokens/s={rate}",
        ]
        if self.mfu is not None:
            fields.append(f"mfu={100 * self.mfu:.1f}%")
        fields += [f"elapsed={duration(self.elapsed_s)}", f"eta={duration(self.eta_s)}"]
        return " ".join(fields)


class Progress:
    """When a line is due, and what it says, for one attempt of a trial."""

    def __init__(
        self,
        *,
        steps: int,
        step_tokens: int,
        first_step: int,
        interval_s: float,
        flops_per_token: float,
        world_size: int,
        peak_flops: float | None,
        is_main: bool,
    ) -> None:
        self.steps, self.step_tokens, self.first_step = steps, step_tokens, first_step
        self.interval_s, self.is_main = interval_s, is_main
        self.flops_per_token, self.world_size, self.peak = flops_per_token, world_size, peak_flops
        self.started = self.last_t = time.monotonic()
        self.last_step = first_step
        self.loss_sum, self.loss_steps = 0.0, 0
        self.counted = first_step  # steps before this one are in loss_sum or an earlier line
        self.log = progress_logger()

    def due(self) -> bool:
        """Rank 0's clock says a line is due (the other ranks leave it to rank 0's)."""
        return self.is_main and time.monotonic() - self.last_t >= self.interval_s

    def wanted(self, done: int, due: bool) -> bool:
        """A line after step `done` (1-based): when due, and after the attempt's first and
        last steps, so a short trial has its lines too."""
        return due or done in (self.first_step + 1, self.steps)

    def add(self, reduced: Reduced) -> None:
        """Each step's train/loss read back from the device; a look into a window that goes
        on brings steps already counted again, which are skipped."""
        for i, loss in enumerate(reduced.step_losses):
            if reduced.first_step + i >= self.counted:
                self.loss_sum += loss
                self.loss_steps += 1
        self.counted = max(self.counted, reduced.first_step + reduced.steps)

    def report(self, step: int, tokens: int, lr: float) -> ProgressLine:
        now = time.monotonic()
        tokens_per_s = (step - self.last_step) * self.step_tokens / max(now - self.last_t, 1e-9)
        elapsed = now - self.started
        per_step = elapsed / max(step - self.first_step, 1)
        line = ProgressLine(
            step=step,
            steps=self.steps,
            tokens=tokens,
            loss=self.loss_sum / max(self.loss_steps, 1),
            lr=lr,
            tokens_per_s=tokens_per_s,
            mfu=mfu(tokens_per_s * self.flops_per_token, self.world_size, self.peak),
            elapsed_s=elapsed,
            eta_s=(self.steps - step) * per_step,
        )
        self.log.info(line.text())
        self.last_t, self.last_step = now, step
        self.loss_sum, self.loss_steps = 0.0, 0
        return line
