"""scalelab: scaling experiments for efficient Transformers.

The notebook API: a sweep from its YAML to fitted scaling laws, each step one call into the
same code the `scalelab` command runs (docs/notebook.md has a worked example).

    import scalelab
    sweep = scalelab.load_sweep("sweeps/demo.yaml", ["variants=[dense,hadamard]"])
    scalelab.plan(sweep).as_dict()        # each trial's cost, memory, time, data, state
    scalelab.submit(sweep)                # blocking; detach=True returns at once
    scalelab.status("demo")               # a row per trial
    scalelab.results("demo").to_pandas()  # the trials table (pyarrow; curves= for curves)
    fit = scalelab.fit("demo")            # laws per variant, gains over dense with intervals
    scalelab.forecast("demo", target="mini")
    scalelab.plot(fit)                    # matplotlib figures by name

Bad input raises what the command reports as an error: SpecError (every problem, with file,
line and key), SweepRefused (a submit that would submit nothing, and why), ResultsError.
Importing scalelab loads no heavy library; each function imports what it needs.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa
    from matplotlib.figure import Figure

    from scalelab.analysis.results.fit import SweepFit
    from scalelab.analysis.results.loss_forecast import Forecast
    from scalelab.orchestrator.door import Detached, Sweep, SweepPlan, SweepRun

__all__ = [
    "cancel",
    "fit",
    "forecast",
    "load_sweep",
    "plan",
    "plot",
    "results",
    "status",
    "submit",
]


def load_sweep(
    path: str | Path, overrides: list[str] | tuple[str, ...] = (), *, max_trials: int | None = None
) -> Sweep:
    """Read, validate, expand and check a sweep YAML, with `KEY=VALUE` overrides as on the
    command line (`scalelab submit FILE KEY=VALUE ...`); more axis combinations than
    `max_trials` (default 1,000) are refused. Raises SpecError on bad input."""
    from scalelab.orchestrator import door

    return door.load(path, overrides, max_trials or door.DEFAULT_MAX_TRIALS)


def _loaded(sweep: Sweep | str | Path) -> Sweep:
    return sweep if hasattr(sweep, "trials") else load_sweep(sweep)  # type: ignore[return-value]


def plan(sweep: Sweep | str | Path) -> SweepPlan:
    """What a submit would do, creating nothing (`scalelab submit --dry-run`): per trial its
    parameters, tokens, FLOPs, GPU-hours, memory and fit, data and recorded state;
    `.refusal()` says why a submit would submit nothing, `.as_dict()` is the JSON plan."""
    from scalelab.orchestrator import door

    return door.plan(_loaded(sweep))


def submit(
    sweep: Sweep | str | Path,
    *,
    detach: bool = False,
    ignore_fit: bool = False,
    quiet: bool = False,
) -> SweepRun | Detached:
    """Record the sweep in MLflow and run every trial that is not FINISHED
    (`scalelab submit`). Blocking, it prints a line per trial as it ends (not with `quiet`)
    and returns the SweepRun (`.ok`, `.outcome`, `.failures`) after a line that counts the
    outcome (`outcome_text`: trials another sweep had trained count as finished, "N finished
    (M reused from other sweeps)"; they are in `.outcome.reused`, not `.outcome.finished`);
    `detach` runs the driver as a Ray job and returns at once. Raises SweepRefused when nothing would be submitted."""
    from scalelab.orchestrator import door

    loaded = _loaded(sweep)
    if detach:
        return door.detach(loaded, ignore_fit=ignore_fit)
    ran = door.run(loaded, ignore_fit=ignore_fit, watcher=None if quiet else _Lines(loaded))
    if not quiet:
        print(f"sweep {loaded.name}: {outcome_text(ran.outcome)}")
        if ran.tuning:
            print(ran.tuning)
    return ran


def outcome_text(outcome: Any) -> str:
    """What a submit did, counted: a trial another sweep had trained (its curve copied,
    `outcome.reused`) counts as finished and is said to be reused, as the `finished` lines
    printed while the sweep ran counted it."""
    reused = len(outcome.reused)
    finished = f"{len(outcome.finished) + reused} finished"
    if reused:
        finished += f" ({reused} reused from other sweeps)"
    parts = [finished, f"{len(outcome.skipped)} skipped (already finished)",
             f"{len(outcome.failed)} failed", f"{len(outcome.killed)} cancelled"]  # fmt: skip
    if outcome.elsewhere:
        parts.append(f"{len(outcome.elsewhere)} run by another driver")
    if outcome.undelivered:
        parts.append(f"{len(outcome.undelivered)} trained, metrics not sent yet")
    return ", ".join(parts)


class _Lines:
    """A line per ended trial on stdout: what a notebook cell shows of a running sweep."""

    def __init__(self, sweep: Sweep) -> None:
        from scalelab.orchestrator.door import run_names

        self.sweep, self.trials, self.done = sweep, list(sweep.trials), 0
        self.names = run_names(self.trials)

    def started(self, ledger: Any, trials: list, finished: set[str], reused: set[str]) -> None:
        from scalelab.orchestrator.door import run_names

        self.trials, self.names = trials, run_names(trials)
        self.done = len(finished & set(self.names))
        total, copied = len(trials), len(reused)
        line = f"sweep {self.sweep.name}: {total - self.done - copied} of {total} trials to train"
        if copied:
            line += f", {copied} trained before in another sweep (metrics copied)"
        print(line)

    def update(self, counts: dict[str, int]) -> None:
        pass

    def trial_ended(self, trial_id: str, outcome: str) -> None:
        self.done += 1
        total = len(self.trials)
        print(f"  {self.names.get(trial_id, trial_id)}: {outcome} ({self.done}/{total})")


def status(sweep: str) -> list[dict[str, Any]]:
    """A row per trial of a recorded sweep (by name or YAML file), as `scalelab status
    --json`: name, variant, size, swept settings, tokens, loss, status, attempts, error."""
    from scalelab.orchestrator import door

    return door.status(str(sweep)).trials


def cancel(sweep: str, trials: list[str] | None = None) -> list[str]:
    """Cancel a sweep's live trials (or the given ones, by run name or id); returns the runs
    marked cancelled."""
    from scalelab.orchestrator import door

    return door.cancel(str(sweep), trials).run_ids


def results(
    sweep: str, *, curves: bool = False, sync: bool = True, tracking_uri: str | None = None
) -> pa.Table:
    """The sweep's trials table (one row per trial), or with `curves` its curves table
    (trial, step, tokens, FLOPs, metric, value), as a pyarrow Table (`.to_pandas()`).
    `sync` first brings the Parquet tables up to date with MLflow (the results door's rule,
    analysis/door.py: incremental; not for a sweep of imported trials)."""
    from scalelab.analysis import door

    return door.trials(sweep, curves=curves, sync=sync, tracking_uri=tracking_uri)


def fit(
    sweep: str,
    *,
    baseline: str = "dense",
    loss: str = "final_val_loss",
    n_resamples: int = 1000,
    sync: bool = True,
    tracking_uri: str | None = None,
    **options: Any,
) -> SweepFit:
    """Scaling laws per variant, each variant's compute-equivalent gain over `baseline`
    with bootstrap intervals, per-size comparisons, the compute-optimal allocation and the
    notes on what the data does not support (`scalelab results fit`); `.to_dict()` is its
    JSON. `options`: where, budgets, huber_delta, holdout_flops, isoflop_bin_width (the
    command's --where, --budget, ...). A sweep of imported trials is not synced."""
    from scalelab.analysis import door

    return door.fit(sweep, sync=sync, tracking_uri=tracking_uri, baseline=baseline, loss=loss,
                    n_resamples=n_resamples, **options)  # fmt: skip


def forecast(
    sweep: str,
    *,
    target: str | None = None,
    flops: float | None = None,
    holdout: str | None = None,
    variant: str = "dense",
    law: str = "auto",
    level: float = 0.95,
    loss: str = "final_val_loss",
    sync: bool = True,
    tracking_uri: str | None = None,
    holdout_flops: float | None = None,
) -> Forecast:
    """A larger run's loss with a prediction interval (`scalelab results forecast`): at a
    size preset `target`, a compute budget `flops`, or `holdout`, a size that was run,
    forecast from the smaller ones, or `holdout_flops`: the runs above this compute,
    forecast from the others."""
    from scalelab.analysis import door

    return door.forecast(sweep, sync=sync, tracking_uri=tracking_uri, variant=variant,
                         size=target, flops=flops, holdout=holdout, loss=loss, law=law,
                         level=level, holdout_flops=holdout_flops)  # fmt: skip


def plot(fit: SweepFit, *, curves: bool = True) -> dict[str, Figure]:
    """The figures a fit's data supports, by name (loss vs FLOPs with each trial's curve,
    loss vs parameters, IsoFLOP, gains, each mechanism's own): matplotlib Figures."""
    from scalelab.analysis import plots
    from scalelab.analysis.results.imports import curves_of

    return plots.figures(fit, curves_of(fit.sweep) if curves else None)
