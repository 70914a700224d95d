"""CLI commands of the orchestrator: submit, cancel, resume, migrate, schema.

Each parses its arguments, calls the orchestrator's one door (orchestrator/door.py) and
renders what it returns. Registered onto `cli.main.app`; ray and mlflow are imported by the
door's calls, not here.

Why one module: the five sweep commands share the submit's rendering (the plan table, the
expansion bar, the run's outcome; the running sweep's view is cli/sweep_watch.py); split,
each would import the others.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from scalelab.cli.completion import sweep_files
from scalelab.cli.console import err, fail, stdout_console
from scalelab.cli.wide_tables import print_table
from scalelab.contract.runs import Status
from scalelab.orchestrator import door

out = stdout_console(200)  # the plan has 15 columns


MAX_TRIALS = typer.Option(
    door.DEFAULT_MAX_TRIALS,
    "--max-trials",
    min=1,
    help="Refuse a sweep with more axis combinations than this (checked before expanding).",
)
# a developer's hook (tests run stand-in jobs through it): works, but not in --help
JOB = typer.Option(
    door.DEFAULT_JOB, "--job", hidden=True, help="The job function, module:function."
)
PROGRESS_FROM = 20_000  # combinations: from here on, expanding shows its progress


def _invalid(problems: list[str]) -> typer.Exit:
    if len(problems) == 1:
        return fail(f"{problems[0]} (invalid sweep, nothing submitted)")
    return fail("invalid sweep, nothing submitted:\n" + "\n".join(problems))


@contextmanager
def door_errors(submitting: bool = False) -> Iterator[None]:
    """The door's refusals and failures as one `error:` line (exit 2; 1 for a sweep that
    stopped mid-way). `submitting`: a failure before anything ran submitted nothing."""

    after = "; nothing submitted" if submitting else ""
    try:
        yield
    except door.SpecError as e:
        raise _invalid(e.problems) from None
    except (door.SweepRefused, door.BackendError, door.MigrationRefused, LookupError) as e:
        raise fail(str(e)) from None
    except door.LedgerUnavailable as e:
        raise fail(f"{e}{after}") from None
    except door.SweepStopped as e:
        raise fail(f"{e}; stopped. Submit the sweep again once it is fixed", 1) from None


class _ExpandBar:
    """`load`'s progress for a big sweep (expanding takes a while): a bar on stderr."""

    def __init__(self) -> None:
        self.bar: Any = None

    def __call__(self, sweep: str, done: int, total: int) -> None:
        if total < PROGRESS_FROM:
            return
        if self.bar is None:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

            err.print(f"sweep {sweep}: expanding {total:,} combinations ...", highlight=False)
            columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
            self.bar = Progress(*columns, console=err, transient=True)
            self.bar.start()
            self.task = self.bar.add_task("expanding", total=total)
        self.bar.update(self.task, completed=done)

    def close(self, sweep: door.Sweep | None) -> None:
        if self.bar is not None:
            self.bar.stop()
            if sweep is not None:
                err.print(f"sweep {sweep.name}: {len(sweep.trials):,} trials", highlight=False)


def _load(path: Path, max_trials: int, overrides: list[str]) -> door.Sweep:
    """Read, validate, expand and check a sweep file (exit 2 on any problem)."""
    return _expanded(lambda bar: door.load(path, overrides, max_trials, bar))


def _expanded(load: Callable[[_ExpandBar], door.Sweep]) -> door.Sweep:
    """`load(bar)`: a sweep, expanded with a progress bar when big, its errors one line."""
    bar, sweep = _ExpandBar(), None
    try:
        with door_errors():
            sweep = load(bar)
    finally:
        bar.close(sweep)
    return sweep


def _plan_table(plan: door.SweepPlan) -> Table:
    """The dry-run's table. Without GPUs it leaves out the GPU columns (memory per GPU, fits)
    and the FLOPs per trial (a GPU's time is FLOPs at its MFU; the caption has their sum,
    the CPU-hours and wall time say the cost), and says host GiB per node as GiB/node (the
    only memory): a small CPU sweep (the demo) fits 120 columns. Columns with nothing to say
    are left out too: `swept` when only the token budget varies (it has its column), `data
    tokens` when no trial's data has been counted yet. --json has every number."""
    spec = plan.sweep.spec
    table = Table(title=f"sweep {spec.name}: {len(plan.trials)} trials on {spec.backend.kind}")
    hours = "CPU" if plan.on_cpu else "GPU"
    swept = {p.trial.trial_id: _swept_text(p) for p in plan.trials}
    counted = any(p.tokens_available is not None for p in plan.trials)
    columns: list[tuple[str, Callable[[door.PlannedTrial], str]]] = [
        ("trial_id", lambda p: p.trial.trial_id),
        ("variant", lambda p: p.trial.variant),
        ("size", lambda p: p.trial.size),
        *([("swept", lambda p: swept[p.trial.trial_id])] if any(swept.values()) else []),
        *([("stage", _stage_text)] if spec.tune is not None else []),
        ("params", lambda p: _count(p.trial.n_params)),
        ("tokens", lambda p: _count(p.trial.tokens)),
        *([] if plan.on_cpu else [("FLOPs", lambda p: f"{p.trial.flops:.3e}")]),
        (f"{hours}-h", lambda p: f"{p.hours:.3g}"),
        ("status", lambda p: f"{p.status} (skip)" if p.status == Status.FINISHED else p.status),
        ("data", lambda p: p.data),  # readiness
        *([("data tokens", _data_tokens)] if counted else []),  # needed / prepared
    ]
    right = {"params", "tokens", "FLOPs", f"{hours}-h", "data tokens"}
    for col, _ in columns:
        table.add_column(col, justify="right" if col in right else "left")
    plan_columns = plan.plan_columns  # memory, fit, time, checkpoint
    for col in plan_columns:
        header = "GiB/node" if plan.on_cpu and col == "host GiB/node" else col
        table.add_column(header, justify="right")
    for p in plan.trials:
        table.add_row(*(cell(p) for _, cell in columns), *p.cells_of(plan_columns))
    live = plan.live
    at = (
        "the CPU rate below"
        if plan.on_cpu
        else f"MFU {spec.estimate.mfu:.0%} of {spec.peak_flops:.3g} FLOP/s"
    )
    table.caption = (
        f"to run: {len(live)} trials, {sum(p.trial.flops for p in live):.3e} FLOPs, "
        f"~{sum(p.hours for p in live):.3g} {hours}-hours at {at}; already finished: "
        f"{len(plan.trials) - len(live)}\n" + _tuning_caption(plan, hours) + plan.placement
    )
    return table


def _stage_text(p: door.PlannedTrial) -> str:
    """A tuned sweep's stage: the search, the ladder at its rate, or waiting for the rate."""
    if p.trial.stage == "pending":
        return "pending (lr tuned first)"
    if p.trial.stage == "tune":
        return "tune"
    return f"{p.trial.stage} lr={p.trial.job.train.lr:.3g}"


def _tuning_caption(plan: door.SweepPlan, unit: str) -> str:
    """A tuned sweep's two stages in compute (`unit`-hours): the search against the whole
    sweep; an untuned sweep of several variants: that they share the sweep's rates."""
    if plan.sweep.spec.tune is None:
        if len({p.trial.variant for p in plan.trials}) < 2:
            return ""
        return (
            "learning rate: every variant at the rates the sweep gives it (no tune:), so a "
            "variant nearer its own optimum gains by that alone; tune: searches each one's\n"
        )
    tune = plan.sweep.spec.tune
    waiting = [p for p in plan.trials if p.trial.stage == "pending"]
    again = [p for p in waiting if tune.compare_at_baseline_rate
             and p.trial.variant != tune.baseline]  # fmt: skip
    more = sum(p.trial.flops for p in again)  # the others at the baseline's rate, once tuned
    total = sum(p.trial.flops for p in plan.trials) + more
    search = [p for p in plan.trials if p.trial.stage in ("tune", "tune+ladder")]
    flops = sum(p.trial.flops for p in search)
    line = (
        f"tuning stage: {len(search)} {'rung-0 ' if tune.method == 'halving' else ''}search "
        f"trials, {flops:.3e} FLOPs, "
        f"~{sum(p.hours for p in search):.3g} {unit}-hours ({flops / total:.0%} of the sweep's "
        "compute)"
    )
    if waiting:
        line += f"; then {len(waiting)} trial{'s' if len(waiting) > 1 else ''} at each variant's tuned rate"
        if again:
            line += (
                f" and {len(again)} at {tune.baseline}'s ({more:.3e} FLOPs, "
                f"~{sum(p.hours for p in again):.3g} {unit}-hours more)"
            )
        line += " (listed at base's rate: the rate does not change their compute)"
    halving = door.search_plan_line(plan.sweep.spec)
    return line + "\n" + (halving + "\n" if halving else "")


def _swept_text(p: door.PlannedTrial) -> str:
    """The swept settings but the token budget, which has its column."""
    return " ".join(
        f"{k.rsplit('.', 1)[-1]}={door.short_value(v)}"
        for k, v in p.swept.items()
        if k != "train.tokens"
    )


def _count(n: int) -> str:
    """A count in 3-4 significant digits (124.4M, 2.49B): the table stays readable at 15
    columns; --json has the exact numbers."""
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.4g}{unit}"
    return str(n)


def _data_tokens(p: door.PlannedTrial) -> str:
    need, have = p.tokens_needed, p.tokens_available
    return "" if need is None else f"{_count(need)} / " + ("?" if have is None else _count(have))


def submit(
    sweep: Path = typer.Argument(
        ...,
        help="Sweep YAML file.",
        exists=False,
        autocompletion=sweep_files,
        metavar="SWEEP_FILE",
    ),
    overrides: list[str] = typer.Argument(
        None,
        metavar="KEY=VALUE",
        help="KEY=VALUE settings over the file's, validated like it, e.g. train.lr=3.0e-4 "
        "backend.concurrency=4 (a key outside the sweep's sections is under base).",
        show_default=False,
    ),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="Print the plan and run submit's checks; submit nothing."
    ),
    as_json: bool = typer.Option(False, "--json", help="With --dry-run: the plan as JSON."),
    detach: bool = typer.Option(
        False, "--detach", help="Run the driver as a Ray job (a local head if none) and return."
    ),
    job: str = JOB,
    summary: bool = typer.Option(
        True,
        "--summary/--no-summary",
        help="When every trial is done: sync the results, fit "
        "the scaling laws, write plots and a report, and print the gains.",
    ),
    max_trials: int = MAX_TRIALS,
    ignore_fit: bool = typer.Option(
        False, "--ignore-fit", help="Submit trials the plan says do not fit their GPUs."
    ),
) -> None:
    """Validate a sweep YAML, record its trials in MLflow and run them (FINISHED ones are skipped)."""
    loaded = _load(sweep, max_trials, overrides or [])
    if dry_run:
        _show_plan(loaded, as_json)
        return
    with door.submitting(loaded.name):  # `status` says so until the sweep is recorded
        with door_errors(submitting=True):
            door.refuse_missing(loaded)  # before the progress bar
        if detach:
            with door_errors(submitting=True):
                detached = door.detach(loaded, job=job, ignore_fit=ignore_fit)
            out.print(
                f"submitted sweep {loaded.name} as Ray job {detached.job_id} on {detached.address}"
            )
            out.print(f"watch it with: scalelab status {loaded.name}")
            return
        ran = _drive(loaded, job, ignore_fit)
    if summary:  # also when some trials failed: the others' results are worth reading
        _summarise(loaded.name)
    if not ran.ok:
        raise typer.Exit(code=1)


def _show_plan(loaded: door.Sweep, as_json: bool) -> None:
    """The plan, as a table or JSON; a sweep that a submit would refuse for a reason the plan
    does not show in its rows (trials under an older identity rule) exits 2 as the submit
    would. Trials that do not fit are in the rows and their fix is printed; a tracking store
    the trials may not write is said on stderr (in JSON: under "tracking_refused"). Data
    that is not here is in the rows ("missing") and listed as blockers after the table (in
    JSON: under "blockers"); then the dry-run exits 2, as the submit would refuse."""
    with door_errors(submitting=True):
        plan = door.plan(loaded)
    if as_json:
        print(json.dumps(plan.as_dict()))
    else:
        print_table(out, _plan_table(plan))
        if plan.branching:
            out.print(plan.branching, soft_wrap=True, highlight=False)
        for line in plan.unfit:
            out.print(f"does not fit: {line}", soft_wrap=True, highlight=False)
        if plan.prepare:  # data that trials would otherwise prepare; a command a line
            out.print("prepare the data first (or the first trial does):", highlight=False)
        for command in plan.prepare:
            out.print(f"  {command}", soft_wrap=True, highlight=False, markup=False)
        if plan.blockers:
            out.print(f"blockers ({len(plan.blockers)}): a submit refuses this sweep until "
                      "its data is here", highlight=False)  # fmt: skip
            for line in plan.blockers:
                out.print(f"  {line}", soft_wrap=True, highlight=False, markup=False)
    if plan.tracking and not as_json:  # a submit refuses it; the plan is still worth reading
        err.print(f"a submit would refuse this sweep: {plan.tracking}", soft_wrap=True,
                  highlight=False, markup=False)  # fmt: skip
    why = plan.refusal(ignore_fit=True, ignore_tracking=True, ignore_blockers=True)
    if why:
        raise fail(why)
    if plan.blockers:
        raise fail(f"sweep {loaded.name}: {len(plan.blockers)} blocker(s), listed with the "
                   "plan; a submit would submit nothing")  # fmt: skip


def _summarise(sweep: str) -> None:
    from scalelab.analysis.report import summarise_sweep
    from scalelab.analysis.results.tables import ResultsError

    with err.status("syncing results, fitting scaling laws (bootstrap), plotting ..."):
        try:
            text = summarise_sweep(sweep, width=out.width)
        except ResultsError as e:
            err.print(f"no summary: {e}")
            return
    out.print(text, end="", highlight=False, markup=False)


def _drive(
    loaded: door.Sweep,
    job: str,
    ignore_fit: bool = False,
    trained_only: bool = False,
    scored: list[str] | None = None,
) -> door.SweepRun:
    """Run the sweep with a progress bar and a line per ended trial; print the outcome and
    each failure with its log. `scored`: the tasks `eval SWEEP` evaluates, whose scores are
    each trial's line (and the lines of the trials whose runs held them already)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from scalelab.cli.sweep_view import failure_lines
    from scalelab.cli.sweep_watch import SweepWatch

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
    with Progress(*columns, console=err, transient=False) as progress:
        terminal = SweepWatch(progress, loaded, scored)
        with door_errors(submitting=True):
            ran = door.run(
                loaded, job=job, ignore_fit=ignore_fit, watcher=terminal, trained_only=trained_only
            )
        terminal.figure.flush()
        progress.update(terminal.task, completed=len(ran.sweep.trials) - len(ran.outcome.elsewhere))
    result = ran.outcome
    finished = f"{len(result.finished) + len(result.reused)} finished"
    if result.reused:
        finished += f" ({len(result.reused)} trained before in another sweep: metrics copied)"
    summary = (
        f"{finished}, {len(result.skipped)} skipped (already done), "
        f"{len(result.failed)} failed, {len(result.killed)} cancelled, "
        f"{len(result.elsewhere)} run by another driver"
    )
    if result.untrained:
        summary += f", {len(result.untrained)} not trained yet (left to `scalelab submit`)"
    if result.undelivered:
        summary += (
            f", {len(result.undelivered)} trained but with metrics still spooled on the "
            "machine that ran them (sent when the trial runs there again)"
        )
    if result.diverged:
        summary += f" ({len(result.diverged)} of them diverged: not retried)"
    out.print(f"sweep {loaded.name}: {summary}")
    if scored is not None:
        for tid in result.skipped:
            terminal.lines.scores(tid, "scored")
    if ran.branching:
        out.print(ran.branching, highlight=False, soft_wrap=True)
    if ran.tuning:
        out.print(ran.tuning, highlight=False, soft_wrap=True)
    for line in failure_lines(ran.failures, loaded.name):
        out.print(line, highlight=False, soft_wrap=True)
    return ran


def cancel(
    sweep: str = typer.Argument(
        ..., help="Sweep name (or its YAML file).", autocompletion=sweep_files
    ),
    trials: list[str] = typer.Argument(
        None,
        help="Run names or trial ids (a prefix will do); default: every live trial.",
        metavar="TRIAL",
    ),
) -> None:
    """Cancel a sweep's live trials (or the given ones); the driver stops them within seconds."""
    with door_errors():
        cancelled = door.cancel(sweep, trials or None)
    out.print(f"cancel requested for {len(cancelled.run_ids)} trial(s) of sweep {cancelled.sweep}")


def resume(
    sweep: str = typer.Argument(..., help="Sweep name."),
    job: str = JOB,
    max_trials: int = MAX_TRIALS,
) -> None:
    """Drive a sweep again from its YAML and overrides recorded in MLflow (unfinished trials)."""
    loaded = _expanded(lambda bar: door.recorded(sweep, max_trials, bar))
    for note in loaded.notes:
        err.print(f"note: {note}", highlight=False)
    if not _drive(loaded, job).ok:
        raise typer.Exit(code=1)


def schema() -> None:
    """Print the sweep YAML's JSON Schema (for editors: yaml-language-server)."""
    print(json.dumps(door.schema(), indent=2))


def migrate(
    sweep: str = typer.Argument(
        ..., help="Sweep name (or its YAML file).", autocompletion=sweep_files
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="Say what would change; change nothing."),
) -> None:
    """Re-key the trials a sweep recorded under an older trial-identity rule, so its finished
    trials count under this version (docs/architecture.md, 'Trial identity'). Idempotent."""
    with door_errors():
        migrated = door.migrate(sweep, dry_run=dry_run)
    name, report = migrated.sweep, migrated.report
    verb = "would re-key" if dry_run else "re-keyed"
    out.print(
        f"sweep {name}: {verb} {len(report.rekeyed)} trials, "
        f"{len(report.tagged)} kept their id, {len(report.current)} already current"
    )
    for old, new in report.rekeyed.items():
        out.print(f"  {old} -> {new}", highlight=False)
    for old, new in report.superseded.items():
        out.print(f"  {old} superseded by {new} (one trial under the new rule)", highlight=False)
    for old in report.unmatched:
        out.print(f"  {old}: recorded id matches neither rule, left as it is", highlight=False)
    for old in report.owing:
        out.print(f"  {old}: metrics still spooled elsewhere, migrate again later", highlight=False)
    if report.superseded or report.owing:
        raise typer.Exit(code=1)


def register(app: typer.Typer) -> None:
    for fn in (submit, cancel, resume, schema, migrate):  # and cli/watch.py
        app.command()(fn)
