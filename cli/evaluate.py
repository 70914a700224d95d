"""`scalelab eval`: a trained trial on lm-evaluation-harness tasks (docs/evaluation.md)."""

from __future__ import annotations

import typer

from scalelab.cli.console import fail


def evaluate(
    target: str = typer.Argument(
        ...,
        metavar="TRIAL_OR_RUN_NAME",
        help="A trial's run name (as `status` shows it), its id (or a unique prefix) under "
        "$SCALELAB_HOME/trials, a trial folder (its newest complete checkpoint is used), or "
        "one checkpoint folder trials/<id>/ckpt/step<N>.",
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
    """Score a trained trial on lm-eval tasks and record the scores on its run.

    Loads the checkpoint as `generate` does (any ZeRO stage; verified, weights-only) and
    evaluates with lm-evaluation-harness through scalelab's model adapter (the trial's own
    tokenizer, KV-cache log-likelihoods). Writes the metrics eval/<task>/<metric> to the
    trial's MLflow run with lm-eval's full results as the artifact eval/<task>.json; `results
    query` shows them after the next sync. Tasks whose scores the run holds are skipped. Task
    data comes from the datasets cache (HF_DATASETS_OFFLINE is honoured); a task whose data is
    not cached, or a bad trial, exits 2 with one line."""
    from scalelab.orchestrator import door

    if device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
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
        raise fail(str(e)) from None
    except door.LedgerUnavailable as e:
        raise fail(str(e)) from None
    for task in answer.skipped:
        print(f"{task}: scores already on run {answer.run_name} (--force evaluates again)")
    for task, executed in answer.executed.items():
        prefix = f"eval/{task}/"
        shown = {
            k.removeprefix(prefix): v for k, v in answer.scores.items() if k.startswith(prefix)
        }
        scores = ", ".join(f"{k} {v:.4f}" for k, v in sorted(shown.items()) if "stderr" not in k)
        ran = ", ".join(
            f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in executed.items()
        )
        print(f"{task}: {scores}  [{ran}]")
    if answer.executed:
        print(
            f"scores written to run {answer.run_name} ({answer.run_id}) of trial {answer.trial_id}"
        )


def register(app: typer.Typer) -> None:
    app.command(name="eval")(evaluate)
