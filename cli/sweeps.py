"""CLI commands of the orchestrator: submit, status, cancel, resume, ui, schema.

Registered onto `cli.main.app`; ray and mlflow are imported inside the commands.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from scalelab.cli.completion import sweep_files
from scalelab.cli.console import err, fail, stdout_console
from scalelab.cli.data import data_plan
from scalelab.cli.wide_tables import print_table
from scalelab.jobs.launch import DEFAULT_JOB
from scalelab.orchestrator.expand import Trial, check_size, expand, plan_rows
from scalelab.orchestrator.job_checks import check_trials
from scalelab.orchestrator.planner import (
    PLAN_COLUMNS,
    TrialPlan,
    placement_summary,
    plan_cells,
    plan_sweep,
    unfit_lines,
)
from scalelab.orchestrator.spec import (
    DEFAULT_MAX_TRIALS,
    SourceMap,
    SpecError,
    SweepSpec,
    load_spec,
    parse_spec,
    read_sweep,
)

out = stdout_console(200)  # the plan has 15 columns


MAX_TRIALS = typer.Option(
    DEFAULT_MAX_TRIALS,
    "--max-trials",
    min=1,
    help="Refuse a sweep with more axis combinations than this (checked before expanding).",
)
PROGRESS_FROM = 20_000  # combinations: from here on, expanding shows its progress


def _invalid(problems: list[str]) -> typer.Exit:
    if len(problems) == 1:
        return fail(f"{problems[0]} (invalid sweep, nothing submitted)")
    return fail("invalid sweep, nothing submitted:\n" + "\n".join(problems))


def _load(path: Path, max_trials: int, overrides: list[str]) -> tuple[SweepSpec, list[Trial], str]:
    """Read, validate, expand and check a sweep file (exit 2 on any problem)."""
    try:
        text = read_sweep(path)
        spec, source = parse_spec(text, str(path), overrides)
        trials = _expand(spec, source, max_trials)
        check_trials(spec, trials, source)
    except SpecError as e:
        raise _invalid(e.problems) from None
    return spec, trials, text


def _expand(spec: SweepSpec, source: SourceMap, max_trials: int) -> list[Trial]:
    """expand(), with a progress bar on stderr for a big sweep (it takes a while)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    check_size(spec, source, max_trials)  # before announcing anything
    total = spec.combinations
    if total < PROGRESS_FROM:
        return expand(spec, source, max_trials)
    err.print(f"sweep {spec.name}: expanding {total:,} combinations ...", highlight=False)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
    with Progress(*columns, console=err, transient=True) as bar:
        task = bar.add_task("expanding", total=total)
        trials = expand(spec, source, max_trials, lambda n: bar.update(task, completed=n))
    err.print(f"sweep {spec.name}: {len(trials):,} trials", highlight=False)
    return trials


def _ledger(spec_name: str, experiment: str | None, create: bool = True) -> Any:
    from scalelab.orchestrator.ledger import Ledger, LedgerUnavailable

    try:
        return Ledger(spec_name, experiment)
    except LedgerUnavailable as e:
        raise fail(f"{e}; nothing submitted") from None


def _read_statuses(spec: SweepSpec) -> dict[str, str]:
    """The ledger's statuses without creating anything (a missing sqlite file = all NEW)."""
    from scalelab.contract.workdir import tracking_uri

    uri = tracking_uri()
    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).exists():
        return {}
    return _ledger(spec.name, spec.experiment_name).statuses()


def _plan_table(spec: SweepSpec, rows: list[dict[str, Any]], plans: list[TrialPlan]) -> Table:
    from scalelab.orchestrator.trial_names import short_value

    table = Table(title=f"sweep {spec.name}: {len(rows)} trials on {spec.backend.kind}")
    columns = ("trial_id", "variant", "size", "swept", "params", "tokens", "FLOPs", "GPU-h")
    for col in (*columns, "status"):
        right = col in ("params", "tokens", "FLOPs", "GPU-h")
        table.add_column(col, justify="right" if right else "left")
    table.add_column("data")  # cli/data.py: readiness, tokens needed / prepared
    table.add_column("data tokens", justify="right")
    for col in PLAN_COLUMNS:  # orchestrator/planner.py: memory, fit, time, checkpoint
        table.add_column(col, justify="right")
    for r, plan in zip(rows, plans, strict=True):
        table.add_row(
            r["trial_id"],
            r["variant"],
            r["size"],
            " ".join(f"{k.rsplit('.', 1)[-1]}={short_value(v)}" for k, v in r["swept"].items()),
            _count(r["params"]),
            _count(r["tokens"]),
            f"{r['flops']:.3e}",
            f"{r['gpu_hours']:.3g}",
            "FINISHED (skip)" if r["status"] == "FINISHED" else r["status"],
            r["data"],
            _data_tokens(r),
            *plan_cells(plan).values(),
        )
    live = [r for r in rows if r["status"] != "FINISHED"]
    table.caption = (
        f"to run: {len(live)} trials, {sum(r['flops'] for r in live):.3e} FLOPs, "
        f"~{sum(r['gpu_hours'] for r in live):.3g} GPU-hours at MFU {spec.estimate.mfu:.0%} of "
        f"{spec.peak_flops:.3g} FLOP/s; already finished: {len(rows) - len(live)}\n"
        + placement_summary(spec)
    )
    return table


def _count(n: int) -> str:
    """A count in 3-4 significant digits (124.4M, 2.49B): the table stays readable at 15
    columns; --json has the exact numbers."""
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.4g}{unit}"
    return str(n)


def _data_tokens(r: dict[str, Any]) -> str:
    need, have = r["tokens_needed"], r["tokens_available"]
    return "" if need is None else f"{_count(need)} / " + ("?" if have is None else _count(have))


def submit(
    sweep: Path = typer.Argument(
        ..., help="Sweep YAML file.", exists=False, autocompletion=sweep_files
    ),
    overrides: list[str] = typer.Argument(
        None,
        help="KEY=VALUE settings over the file's, validated like it, e.g. train.lr=3.0e-4 "
        "backend.concurrency=4 (a key outside the sweep's sections is under base).",
        show_default=False,
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan; submit nothing."),
    as_json: bool = typer.Option(False, "--json", help="With --dry-run: the plan as JSON."),
    detach: bool = typer.Option(
        False, "--detach", help="Run the driver as a Ray job (a local head if none) and return."
    ),
    job: str = typer.Option(DEFAULT_JOB, "--job", help="The job function, module:function."),
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
    overrides = overrides or []
    spec, trials, text = _load(sweep, max_trials, overrides)
    plans = plan_sweep(spec, trials)
    if dry_run:
        from scalelab.orchestrator.trial_names import run_names, swept_settings

        rows = plan_rows(spec, trials, _read_statuses(spec))
        names, swept = run_names(trials), swept_settings(trials)
        for r in rows:
            r.update(name=names[r["trial_id"]], swept=swept[r["trial_id"]])
        data_rows, prepare_commands = data_plan(trials)
        rows = [r | d for r, d in zip(rows, data_rows, strict=True)]
        if as_json:
            keys = (
                "trial_id",
                "name",
                "swept",
                "variant",
                "size",
                "params",
                "tokens",
                "flops",
                "gpu_hours",
                "status",
                "data",
                "tokens_needed",
                "tokens_available",
            )
            trials_json = [
                {k: r[k] for k in keys} | {"plan": p.as_dict()}
                for r, p in zip(rows, plans, strict=True)
            ]
            where = placement_summary(spec)
            print(json.dumps({"sweep": spec.name, "placement": where, "trials": trials_json}))
        else:
            print_table(out, _plan_table(spec, rows, plans))
            for line in unfit_lines(trials, plans):
                out.print(f"does not fit: {line}", soft_wrap=True, highlight=False)
            for command in prepare_commands:  # data that trials would otherwise prepare
                out.print(f"prepare the data first (or the first trial does): {command}",
                          soft_wrap=True, highlight=False)  # fmt: skip
        return
    unfit = unfit_lines(trials, plans)
    if unfit and not ignore_fit:
        raise fail(
            f"{len(unfit)} trial(s) do not fit, nothing submitted ({placement_summary(spec)}; "
            "--ignore-fit submits them anyway):\n" + "\n".join(unfit)
        )
    if detach:
        from scalelab.orchestrator.detach import submit_detached

        try:
            job_id, address = submit_detached(sweep.resolve(), job, max_trials, overrides)
        except RuntimeError as e:
            raise fail(str(e)) from None
        out.print(f"submitted sweep {spec.name} as Ray job {job_id} on {address}")
        out.print(f"watch it with: scalelab status {spec.name}")
        return
    failed = _drive(spec, trials, text, str(sweep.resolve()), job, overrides)
    if summary:  # also when some trials failed: the others' results are worth reading
        _summarise(spec.name)
    if failed:
        raise typer.Exit(code=1)


def _summarise(sweep: str) -> None:
    from scalelab.analysis.report import summarise_sweep
    from scalelab.analysis.results.store import ResultsError

    with err.status("syncing results, fitting scaling laws (bootstrap), plotting ..."):
        try:
            text = summarise_sweep(sweep, width=out.width)
        except ResultsError as e:
            err.print(f"no summary: {e}")
            return
    out.print(text, end="", highlight=False, markup=False)


def _drive(
    spec: SweepSpec, trials: list[Trial], text: str, path: str, job: str, overrides: list[str]
) -> bool:
    """Run the sweep with a progress bar and a line per ended trial; print the outcome and
    each failure with its log. True when a trial failed."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from scalelab.analysis.live_figure import LiveFigure
    from scalelab.cli.sweep_view import TrialLines, failure_lines
    from scalelab.orchestrator.backends import BackendError, preflight
    from scalelab.orchestrator.ledger import LedgerUnavailable
    from scalelab.orchestrator.scheduler import run_sweep

    try:
        preflight(spec.backend)
    except BackendError as e:
        raise fail(f"{e}; nothing submitted") from None
    ledger = _ledger(spec.name, spec.experiment_name)
    _refuse_unmigrated(ledger)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
    with Progress(*columns, console=err, transient=False) as progress:
        task = progress.add_task(f"sweep {spec.name}", total=len(trials))
        lines = TrialLines(progress.console, trials, set(_read_statuses_of(ledger)))
        figure = LiveFigure(ledger, trials, warn=lambda m: progress.console.print(f"note: {m}"))

        def ended(trial_id: str, outcome: str) -> None:
            lines.ended(trial_id, outcome)
            figure.trial_ended(trial_id, outcome)

        def update(counts: dict[str, int]) -> None:
            figure.poll()
            eta = lines.eta()
            progress.update(
                task,
                completed=counts["done"],
                description=f"sweep {spec.name} ({counts['running']} running{', ' if eta else ''}"
                f"{eta})",
            )

        try:
            result = run_sweep(
                spec, trials, ledger, job=job, on_update=update, on_trial=ended,
                spec_yaml=text, spec_path=path, overrides=overrides,
            )  # fmt: skip
        except BackendError as e:
            raise fail(str(e)) from None
        except LedgerUnavailable as e:  # mid-sweep: what MLflow holds is the state to resume
            raise fail(f"{e}; stopped. Submit the sweep again once it is fixed", 1) from None
        figure.flush()
        progress.update(task, completed=len(trials) - len(result.elsewhere))
    summary = (
        f"{len(result.finished)} finished, {len(result.skipped)} skipped (already done), "
        f"{len(result.failed)} failed, {len(result.killed)} cancelled, "
        f"{len(result.elsewhere)} run by another driver"
    )
    if result.reused:
        summary += f", {len(result.reused)} trained before in another sweep (metrics copied)"
    if result.undelivered:
        summary += (
            f", {len(result.undelivered)} trained but with metrics still spooled on the "
            "machine that ran them (sent when the trial runs there again)"
        )
    if result.diverged:
        summary += f" ({len(result.diverged)} of them diverged: not retried)"
    out.print(f"sweep {spec.name}: {summary}")
    for line in failure_lines(ledger, result.failed, spec.name):
        out.print(line, highlight=False, soft_wrap=True)
    return bool(result.failed)


def _read_statuses_of(ledger: Any) -> list[str]:
    """The trial ids already FINISHED (their FLOPs are not in the ETA)."""
    return [tid for tid, status in ledger.statuses().items() if status == "FINISHED"]


def _find(sweep: str) -> Any:
    from scalelab.orchestrator.ledger import LedgerUnavailable, find_sweep

    if sweep.endswith((".yaml", ".yml")) and Path(sweep).exists():
        try:
            spec, _ = load_spec(sweep)
        except SpecError as e:
            raise _invalid(e.problems) from None
        sweep = spec.name
    try:
        return find_sweep(sweep)
    except (LookupError, LedgerUnavailable) as e:
        raise fail(str(e)) from None


def cancel(
    sweep: str = typer.Argument(
        ..., help="Sweep name (or its YAML file).", autocompletion=sweep_files
    ),
    trials: list[str] = typer.Argument(None, help="Trial ids (default: every live trial)."),
) -> None:
    """Cancel a sweep's live trials (or the given ones); the driver stops them within seconds."""
    ledger = _find(sweep)
    touched = ledger.request_cancel(trials or None)
    scancel = [
        r.tags["scalelab.job_ref"].removeprefix("slurm:")
        for r in ledger.records().values()
        if r.run_id in touched and r.tags.get("scalelab.job_ref", "").startswith("slurm:")
    ]
    if scancel:
        import subprocess

        subprocess.run(["scancel", *scancel], check=False)
    out.print(f"cancel requested for {len(touched)} trial(s) of sweep {ledger.sweep}")


def resume(
    sweep: str = typer.Argument(..., help="Sweep name."),
    job: str = typer.Option(DEFAULT_JOB, "--job", help="The job function, module:function."),
    max_trials: int = MAX_TRIALS,
) -> None:
    """Drive a sweep again from its YAML and overrides recorded in MLflow (unfinished trials)."""
    from scalelab.contract.runs import Tag

    ledger = _find(sweep)
    tags = ledger.parent_tags()
    path = tags.get("scalelab.spec_path", "")
    text = tags.get("scalelab.spec_yaml")
    try:
        if text is None:
            if not path or not Path(path).exists():
                raise fail(f"sweep {sweep}: its YAML is not recorded; submit the file again")
            text = read_sweep(path)
        overrides = json.loads(tags.get(Tag.OVERRIDES, "[]"))
        spec, source = parse_spec(text, path or "<recorded sweep>", overrides)
        trials = _expand(spec, source, max_trials)
        check_trials(spec, trials, source)
    except SpecError as e:
        raise _invalid(e.problems) from None
    if _drive(spec, trials, text, path, job, overrides):
        raise typer.Exit(code=1)


def schema() -> None:
    """Print the sweep YAML's JSON Schema (for editors: yaml-language-server)."""
    print(json.dumps(SweepSpec.model_json_schema(), indent=2))


def _refuse_unmigrated(ledger: Any) -> None:
    from scalelab.orchestrator.migrate import needs_migration

    stale = needs_migration(ledger)
    if stale:
        raise fail(
            f"sweep {ledger.sweep} has {stale} trials recorded under an older identity rule; "
            f"run `scalelab migrate {ledger.sweep}` first (nothing submitted)"
        )


def migrate(
    sweep: str = typer.Argument(
        ..., help="Sweep name (or its YAML file).", autocompletion=sweep_files
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="Say what would change; change nothing."),
) -> None:
    """Re-key the trials a sweep recorded under an older trial-identity rule, so its finished
    trials count under this version (docs/architecture.md, 'Trial identity'). Idempotent."""
    from scalelab.orchestrator.ledger import LedgerUnavailable
    from scalelab.orchestrator.migrate import MigrationRefused, migrate_sweep

    ledger = _find(sweep)
    try:
        report = migrate_sweep(ledger, dry_run=dry_run)
    except (MigrationRefused, LedgerUnavailable) as e:
        raise fail(str(e)) from None
    verb = "would re-key" if dry_run else "re-keyed"
    out.print(
        f"sweep {ledger.sweep}: {verb} {len(report.rekeyed)} trials, "
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
