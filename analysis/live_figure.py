"""The parent run's loss-against-compute figure while a sweep runs.

Each time trials finish, the driver draws every finished trial's val/loss curve against
its training FLOPs (the metric `val/loss_at_gflop`, whose step is GFLOPs), coloured by
variant, and attaches it to the sweep's parent run as `plots/loss_vs_flops.png`: a person
watching the sweep in the MLflow UI sees the picture fill in. Re-drawn at most every
`min_interval_s` (and once more when the sweep ends); the summary then replaces it with
the fitted figure of the same name (`analysis/plots.py`). A wsd cooldown branch (trained
off its trunk's checkpoint: docs/sweep-yaml.md) is drawn dashed. Best effort: a drawing or
upload that fails costs the picture, never the sweep.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from scalelab.analysis import plots
from scalelab.contract.runs import Metric, Tag

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from scalelab.orchestrator.door import Ledger, Trial

MIN_INTERVAL_S = 30.0
FOLDER, NAME = "plots", "loss_vs_flops.png"  # the summary's fitted figure has the same name
FINISHED_KEY = "scalelab_finished"  # PNG text chunk: how many trials the figure shows
BRANCHES_KEY = "scalelab_branches"  # PNG text chunk: how many of them are cooldown branches


class LiveFigure:
    """Draws and attaches the figure as trials finish (`trial_ended`), throttled; `poll`
    draws what a throttled call left out once the interval has passed, `flush` at the end."""

    def __init__(
        self,
        ledger: Ledger,
        trials: list[Trial],
        *,
        min_interval_s: float = MIN_INTERVAL_S,
        warn: Callable[[str], None] = lambda message: None,
    ) -> None:
        self.ledger, self.min_interval_s, self.warn = ledger, min_interval_s, warn
        self.variants = {t.trial_id: t.variant for t in trials}
        self.total = len(trials)
        self.finished: list[str] = []
        self.curves: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # a finished trial's: fixed
        self.branches: set[str] = set()  # finished trials that trained off a trunk
        self.dirty = False
        self.last_drawn = -float("inf")
        self.failed = False

    def trial_ended(self, trial_id: str, outcome: str) -> None:
        if outcome == "finished" and trial_id in self.variants:
            self.finished.append(trial_id)
            self.dirty = True
        self.poll()

    def poll(self) -> None:
        if self.dirty and time.monotonic() - self.last_drawn >= self.min_interval_s:
            self.flush()

    def flush(self) -> None:
        if not self.dirty or self.failed or self.ledger.parent_id is None:
            return
        self.dirty, self.last_drawn = False, time.monotonic()
        try:
            self._attach(self._draw(self._read_curves()))
        except Exception as e:  # best effort: the sweep goes on without it
            self.failed = True
            self.warn(f"the live loss-vs-FLOPs figure is not updated any more: {e}")

    def _read_curves(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        new = [tid for tid in self.finished if tid not in self.curves]
        if new:
            records = self.ledger.records()
            for tid in new:
                if records[tid].tags.get(Tag.BRANCHED_FROM):
                    self.branches.add(tid)
                history = self.ledger.client.get_metric_history(
                    records[tid].run_id, Metric.VAL_LOSS_AT_GFLOP
                )
                points = sorted((m.step, m.value) for m in history)
                flops = np.array([step * 1e9 for step, _ in points], dtype=float)
                self.curves[tid] = (flops, np.array([v for _, v in points], dtype=float))
        return {tid: self.curves[tid] for tid in self.finished}

    def _draw(self, curves: dict[str, tuple[np.ndarray, np.ndarray]]) -> Figure:
        fig, ax = plots.new_figure()
        variants = sorted(set(self.variants.values()))
        colour = plots.colours(variants)
        labelled: set[str] = set()
        for tid, (flops, loss) in curves.items():
            keep = (flops > 0) & np.isfinite(loss)
            if not keep.any():
                continue
            v = self.variants[tid]
            label = None if v in labelled else v
            labelled.add(v)
            style = "--" if tid in self.branches else "-"
            ax.plot(flops[keep], loss[keep], color=colour[v], lw=1.0, ls=style, marker=".",
                    label=label)  # fmt: skip
        flops = np.concatenate([f for f, _ in curves.values()] or [np.zeros(0)])
        if plots.spans_decades(flops):  # else a log axis labels its minor ticks, unreadably
            ax.set_xscale("log")
        ax.set_xlabel("training FLOPs")
        ax.set_ylabel("val/loss")
        title = f"val/loss against compute: {len(curves)} of {self.total} trials finished"
        branched = len(self.branches & set(curves))
        ax.set_title(title + (f" ({branched} cooldown branches, dashed)" if branched else ""))
        if labelled:
            ax.legend(fontsize="small")
        return fig

    def _attach(self, fig: Figure) -> None:
        with tempfile.TemporaryDirectory(prefix="scalelab-live-") as tmp:
            path = Path(tmp) / NAME
            branched = len(self.branches & set(self.finished))
            fig.savefig(
                path,
                metadata={FINISHED_KEY: str(len(self.finished)), BRANCHES_KEY: str(branched)},
            )
            self.ledger.client.log_artifact(self.ledger.parent_id, str(path), FOLDER)
