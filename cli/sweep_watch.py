"""What `submit` shows of a running sweep: the progress bar, a line per ended trial, the live
figure, and plain lines where the output is a log file."""

from __future__ import annotations

import time
from typing import Any

from scalelab.orchestrator import door

PLAIN_EVERY_S = 60.0  # output that is not a terminal (a log file): the counts this often


class SweepWatch:
    """What the terminal shows of a running sweep (door.Watcher): a progress bar with the
    running count and an ETA, a line per ended trial; and the parent run's live figure.
    Where the output is not a terminal (`submit > log`, nohup) the bar draws nothing until
    the end, so a line says the sweep started and another gives the counts every
    PLAIN_EVERY_S."""

    def __init__(self, progress: Any, loaded: door.Sweep, scored: list[str] | None = None) -> None:
        self.progress, self.sweep, self.scored = progress, loaded, scored
        self.task = progress.add_task(f"sweep {loaded.name}", total=len(loaded.trials))
        self.plain = not progress.console.is_terminal
        self.last_plain = time.monotonic()

    def started(self, ledger: Any, trials: list, finished: set[str], reused: set[str]) -> None:
        from scalelab.analysis.live_figure import LiveFigure
        from scalelab.cli.sweep_view import TrialLines

        console = self.progress.console
        self.progress.update(self.task, total=len(trials))  # a tuned sweep's second stage: all
        if hasattr(self, "figure"):
            self.figure.flush()
        self.lines = TrialLines(console, trials, finished, ledger, self.scored, reused)
        self.figure = LiveFigure(ledger, trials, warn=lambda m: console.print(f"note: {m}"))
        if self.plain:
            search = trials and all(t.stage in ("tune", "tune+ladder") for t in trials)
            stage = " (the lr search; the sweep's own trials follow)" if search else ""
            console.print(
                f"sweep {self.sweep.name}: {len(trials) - len(finished)} of {len(trials)} trials "
                f"to run{stage}; a line as each ends, the counts every {PLAIN_EVERY_S:.0f} s",
                highlight=False, markup=False,
            )  # fmt: skip

    def trial_ended(self, trial_id: str, outcome: str) -> None:
        self.lines.ended(trial_id, outcome)
        self.figure.trial_ended(trial_id, outcome)

    def update(self, counts: dict[str, int]) -> None:
        self.figure.poll()
        eta = self.lines.eta()
        if self.plain and time.monotonic() - self.last_plain >= PLAIN_EVERY_S:
            self.last_plain = time.monotonic()
            self.progress.console.print(
                f"sweep {self.sweep.name}: {counts['done']}/{counts['total']} done, "
                f"{counts['running']} running{', ' if eta else ''}{eta}",
                highlight=False, markup=False,
            )  # fmt: skip
        self.progress.update(
            self.task,
            completed=counts["done"],
            description=f"sweep {self.sweep.name} ({counts['running']} running"
            f"{', ' if eta else ''}{eta})",
        )
