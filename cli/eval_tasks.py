"""`scalelab eval`: a trained trial on lm-evaluation-harness tasks (docs/evaluation.md)."""

from __future__ import annotations

import typer

from scalelab.cli.console import fail


def evaluate(
    target: str = typer.Argument(
        ...,
        metavar="TRIAL_OR_SWEEP",
        help="A trial's run name (as `status` shows it), its id (or a unique prefix) under "
        "$SCALELAB_HOME/trials, a trial folder (its newest complete checkpoint is used), "
        "one checkpoint folder trials/<id>/ckpt/step<N>; or, where it names no trial, a "
        "sweep: every FINISHED trial of it, through the sweep's own backend.",
    ),
    tasks: str = typer.Option(
        ...,
        "--tasks",
        "-t",
        help="Comma-separated lm-eval task or group names (piqa,hellaswag,arc_easy,blimp), "
        "scalelab_zen (shipped, offline), or paths to local task YAMLs.",
    ),
    sweep: str = typer.Option(
        None, "--sweep", help="The sweep of the run name, where two sweeps have one so named."
    ),
    limit: int = typer.Option(None, "--limit", min=1, help="Items per task (default: all)."),
    soft: bool = typer.Option(
        False,
        "--soft",
        help="TSA's soft gates and BudgetFormer's soft mask (training's function) instead of "
        "their inference path (sparse tokens, top-k heads).",
    ),
    cache: bool = typer.Option(
        None,
        "--cache/--no-cache",
        help="Score every context's continuations on its KV cache, or never (full forwards). "
        "Default: the cache where a context shared by several continuations saves enough.",
        show_default=False,
    ),
    batch_size: int = typer.Option(16, "--batch-size", min=1, help="Sequences per forward."),
    device: str = typer.Option("auto", help="cpu, cuda, or auto (cuda when present)."),
    force: bool = typer.Option(
        False, "--force", help="Evaluate again tasks whose scores the run already holds."
    ),
) -> None:
    """Score a trained trial (or every finished trial of a sweep) on lm-eval tasks and
    record the scores on its run.

    Loads the checkpoint as `generate` does (any ZeRO stage; verified, weights-only) and
    evaluates with lm-evaluation-harness through scalelab's model adapter (the trial's own
    tokenizer, KV-cache log-likelihoods). Writes the metrics eval/<task>/<metric> to the
    trial's MLflow run with lm-eval's full results as the artifact eval/<task>.json, and syncs
    the sweep's results tables again where they were synced before (`results query` and
    `results compare` read the scores at once). Tasks whose scores the run holds are skipped. Task
    data comes from the datasets cache (HF_DATASETS_OFFLINE is honoured); a task whose data is
    not cached, or a bad trial, exits 2 with one line. A sweep's trials are evaluated as
    its `eval.downstream` step would (the trials' own backend and devices, each in a job of
    its own, skipping tasks a run holds); trials not trained yet are left to `submit`."""
    from scalelab.orchestrator import door

    given_device = device != "auto"
    device = _device(device)
    names = [t.strip() for t in tasks.split(",") if t.strip()]
    if not names:
        raise fail("--tasks: give at least one task name")
    options = door.EvalOptions(
        limit=limit,
        mode="soft" if soft else "inference",
        cache=cache,
        batch_size=batch_size,
        device=device,
        force=force,
    )
    try:
        answer = door.evaluate(target, names, options, sweep=sweep)
    except door.EvalError as e:
        if not _names_a_sweep(target):
            raise fail(f"{e}; no sweep is named {target!r} either") from None
        if force:
            raise fail("--force evaluates one trial again; give its run name or id") from None
        if given_device:
            from scalelab.cli.console import err

            err.print(f"note: --device {device} is not used: a sweep's trials are evaluated "
                      "on their own devices", highlight=False, markup=False)  # fmt: skip
        _evaluate_sweep(target, names, options)
        return
    except door.LedgerUnavailable as e:
        raise fail(str(e)) from None
    for task in answer.skipped:
        print(f"{task}: scores already on run {answer.run_name} (--force evaluates again)")
    for task, executed in answer.executed.items():
        scores = door.score_text(task, answer.scores)
        ran = ", ".join(
            f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in executed.items()
        )
        print(f"{task}: {scores}  [{ran}]")
    if answer.executed:
        print(
            f"scores written to run {answer.run_name} ({answer.run_id}) of trial {answer.trial_id}"
        )
        _resync(answer.sweep)


def _device(device: str) -> str:
    """cpu, cuda or cuda:N (auto: cuda when present); one line for anything else."""
    import re

    if not re.fullmatch(r"auto|cpu|cuda(:\d{1,3})?", device):
        raise fail(f"--device {device!r}: give cpu, cuda, cuda:N or auto")
    if device == "cpu":
        return device
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    index = int(device.partition(":")[2] or 0)
    if index >= torch.cuda.device_count():
        raise fail(f"--device {device}: {torch.cuda.device_count()} CUDA device(s) here")
    return device


def _resync(sweep: str) -> None:
    """The sweep's results tables read the new scores (`results query`, `compare`, ... need
    no `results sync` first): synced again where they were synced before."""
    from scalelab.analysis.results.tables import ResultsError
    from scalelab.cli.console import err
    from scalelab.cli.results_common import resynced

    try:
        line = resynced(sweep)
    except ResultsError as e:  # the scores are on the runs; `results sync` reads them later
        err.print(f"note: results tables not synced: {e}", highlight=False, markup=False)
        return
    if line:
        err.print(line, highlight=False, markup=False)


def _names_a_sweep(target: str) -> bool:
    from scalelab.orchestrator import door

    try:
        door.find(target)
    except (LookupError, door.LedgerUnavailable, door.SpecError):
        return False
    return True


def _evaluate_sweep(name: str, tasks: list[str], options: object) -> None:
    """Every FINISHED trial of the sweep, its owed tasks, through the sweep's scheduler and
    backend (each trial's evaluation a job on its own devices): the sweep as recorded with
    eval.downstream set to these tasks (docs/evaluation.md, 'In a sweep'); a line per trial
    with its scores, and the sweep's results tables synced again."""
    import json

    from scalelab.cli.sweeps import _drive, _expanded
    from scalelab.orchestrator import door

    more = [f"eval.downstream.tasks={json.dumps(tasks)}"]
    more += [
        f"eval.downstream.mode={options.mode}",
        f"eval.downstream.batch_size={options.batch_size}",
    ]
    if options.limit is not None:
        more.append(f"eval.downstream.limit={options.limit}")
    try:  # every task loads here, with its data, before Ray or any job starts
        scored = door.scored_names(tasks)
        door.check_tasks(tasks)
    except door.EvalError as e:
        raise fail(str(e)) from None
    loaded = _expanded(lambda bar: door.recorded(name, progress=bar, more_overrides=tuple(more)))
    ran = _drive(loaded, door.DEFAULT_JOB, trained_only=True, scored=scored)
    if ran.outcome.finished:
        _resync(name)
    if not ran.ok:
        raise typer.Exit(code=1)


def register(app: typer.Typer) -> None:
    app.command(name="eval")(evaluate)
