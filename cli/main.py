"""The `scalelab` command line. Heavy libraries (torch, ray, mlflow) are imported inside
the commands that need them, so `scalelab --help` starts fast."""

from __future__ import annotations

import json
import sys

import typer
from pydantic import ValidationError
from rich.table import Table

from scalelab.cli.console import fail, stdout_console
from scalelab.cli.help_format import HelpGroup, install, version_option
from scalelab.contract.config import format_config_error
from scalelab.models import catalog
from scalelab.models.config import ModelConfig
from scalelab.models.sizes import SIZES
from scalelab.orchestrator.door import DEFAULT_MAX_TRIALS

install()  # readable placeholders in every --help (cli/help_format.py)
app = typer.Typer(
    cls=HelpGroup,
    help="scalelab: scaling experiments for efficient Transformers "
    "(dense GPT, Hadamard output projection, BudgetFormer, Token-Selective Attention).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
console = stdout_console(160)


@app.callback()
def _root(version: bool = version_option()) -> None:  # the commands below are the app
    pass


@app.command()
def models(
    variant: list[str] = typer.Option(
        None,
        "--variant",
        "-v",
        help="Variant(s) to list, e.g. dense, hadamard, budget+tsa. "
        "Default: dense and each single mechanism.",
    ),
    size: list[str] = typer.Option(None, "--size", "-s", help="Size preset(s). Default: all."),
    vocab_size: int = typer.Option(50257, help="Vocabulary size (50257 = GPT-2 BPE)."),
    block_size: int = typer.Option(1024, help="Context length used for FLOPs."),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON list instead of a table."),
) -> None:
    """List the model size presets with exact parameter counts and training FLOPs per token."""
    from scalelab.models.flops import count_params, train_flops_per_token

    variants = variant or ["dense", *(m.name for m in catalog.mechanisms())]
    sizes = size or list(SIZES)
    rows = []
    for name in sizes:
        for var in variants:
            try:
                cfg = ModelConfig(
                    size=name,
                    vocab_size=vocab_size,
                    block_size=block_size,
                    **catalog.variant_fields(var),
                )
            except ValidationError as e:
                raise fail(format_config_error(e, "scalelab models")) from None
            except ValueError as e:
                raise fail(str(e)) from None
            rows.append(
                {
                    "name": name,
                    "variant": cfg.variant,
                    "n_layer": cfg.n_layer,
                    "d_model": cfg.d_model,
                    "n_head": cfg.n_head,
                    "params": count_params(cfg),
                    "nonembed_params": count_params(cfg, non_embedding=True),
                    "train_flops_per_token": train_flops_per_token(cfg),
                }
            )
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    table = Table(title=f"Model presets (vocab {vocab_size}, context {block_size})")
    for col in (
        "name",
        "variant",
        "layers",
        "d_model",
        "heads",
        "params",
        "non-embed",
        "train FLOPs/token",
    ):
        table.add_column(col, justify="left" if col in ("name", "variant") else "right")
    dense_params = {r["name"]: r["params"] for r in rows if r["variant"] == "dense"}
    for r in rows:
        params = f"{r['params']:,}"
        base = dense_params.get(r["name"])
        if base and r["variant"] != "dense":
            params += f" ({(r['params'] - base) / base:+.1%})"
        table.add_row(
            r["name"],
            r["variant"],
            str(r["n_layer"]),
            str(r["d_model"]),
            str(r["n_head"]),
            params,
            f"{r['nonembed_params']:,}",
            f"{r['train_flops_per_token']:.3e}",
        )
    console.print(table)


@app.command()
def variants() -> None:
    """List the variant names a sweep may use."""
    for name in catalog.variants():
        print(name)


@app.command()
def train(
    config: str = typer.Argument(..., help="A JobConfig YAML/JSON, or a sweep YAML with --trial."),
    trial: str = typer.Option(
        None, "--trial", help="With a sweep YAML: the trial id (or a unique prefix) to run."
    ),
    run_id: str = typer.Option(None, "--run-id", help="Log into this existing MLflow run."),
    max_trials: int = typer.Option(
        DEFAULT_MAX_TRIALS, "--max-trials", min=1, help="With --trial: the sweep's size limit."
    ),
) -> None:
    """Run one training job here (under torchrun / deepspeed / srun for several ranks).
    Exit code 0 finished, 1 failed, 75 preempted (requeue me)."""
    from pathlib import Path

    from scalelab.orchestrator.door import SpecError

    if not Path(config).is_file():
        raise fail(f"{config}: no such file")
    try:
        job = _job_file(config) if trial is None else _sweep_trial(config, trial, max_trials)
    except SpecError as e:
        raise fail("\n".join(e.problems)) from None
    from scalelab.contract.outcome import exit_code
    from scalelab.jobs.training.train import run

    try:
        result = run(job, run_id)
    except ValueError as e:  # the job's checks: devices, batch split, data
        raise fail(f"{config}: {e}") from None
    print(json.dumps(result.__dict__))
    raise typer.Exit(exit_code(result.status))


def _job_file(path: str) -> object:
    """A JobConfig from a YAML or JSON file, read like a sweep (errors name file:line)."""
    from scalelab.jobs.config import JobConfig
    from scalelab.orchestrator.door import SpecError, load_yaml, located_errors, read_sweep

    data, source = load_yaml(read_sweep(path), path)
    try:
        return JobConfig.model_validate(data)
    except ValidationError as e:
        raise SpecError(located_errors(e, source)) from None


def _sweep_trial(path: str, selector: str, max_trials: int) -> object:
    from scalelab.orchestrator.door import SpecError, expand, load_spec

    trials = expand(*load_spec(path), max_trials=max_trials)
    found = [t for t in trials if t.trial_id.startswith(selector)]
    if len(found) != 1:
        ids = ", ".join(t.trial_id for t in trials)
        raise SpecError(
            [f"--trial {selector!r} matches {len(found)} of the sweep's trials ({ids})"]
        )
    return found[0].job


from scalelab.cli import sweeps as _sweeps  # noqa: E402
from scalelab.cli import watch as _watch  # noqa: E402

_sweeps.register(app)
_watch.register(app)


from scalelab.cli import generate as _generate  # noqa: E402

_generate.register(app)

from scalelab.cli import eval_tasks as _evaluate  # noqa: E402

_evaluate.register(app)

from scalelab.cli.results import app as results_app  # noqa: E402

app.add_typer(results_app, name="results")

from scalelab.cli.data import app as data_app  # noqa: E402

app.add_typer(data_app, name="data")


def main() -> None:
    for arg in sys.argv[1:]:
        try:
            arg.encode()
        except UnicodeEncodeError:  # a byte that is not UTF-8 (Python's surrogate escape)
            shown = ascii(arg if len(arg) <= 80 else arg[:80] + "...")
            print(f"error: argument {shown} is not UTF-8 text", file=sys.stderr)
            sys.exit(2)
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
