"""Every check of a job that needs no device, in one place and torch-free.

The training job runs them (`jobs.training.train.check_job`, with its devices' checks) before any
process group, file or MLflow run exists; the orchestrator runs the same functions for
every trial of a sweep at `submit` and `--dry-run`, before any run is created, so a sweep
whose trials cannot start is refused with `file:line: key: message` instead of failing
trial by trial. Checks that need only the config are JobConfig validators (jobs/config.py).

- `check_placement(job, world_size, device)`: the budget (at least one whole batch, and
  not beyond any real run, a wsd warm-up that ends before its cooldown), the batch split across ranks and micro-batches, the dtype the
  device supports (device None: not known yet), and the gradient dtype the ZeRO stage
  supports (a limit of DeepSpeed 0.19, not of the config);
- `check_environment(job)`: what the data config reads (the source exists, the tokenizer
  loads and fits model.vocab_size, ...: jobs.data.trial.check_data).
Each raises JobCheckError naming the key to change.
"""

from __future__ import annotations

import re

from scalelab.jobs.config import MAX_TOKENS, JobCheckError, JobConfig
from scalelab.jobs.schedule import check_schedule
from scalelab.jobs.token_budget import total_steps, total_tokens
from scalelab.jobs.training.ds_config import BatchPlan, plan_batch

_SECTIONS = tuple(name for name in JobConfig.model_fields if name != "seed")
_NAMED_KEY = re.compile(rf"\b((?:{'|'.join(_SECTIONS)})\.[A-Za-z_][A-Za-z0-9_]*)")


def check_budget(job: JobConfig) -> None:
    """A budget given in tokens per parameter or FLOPs resolves to at least one whole batch
    and to no more tokens than MAX_TOKENS (`train.tokens` itself is bounded by its field)."""
    t = job.train
    keys = [k for k in ("tokens", "tokens_per_param", "flops") if getattr(t, k) is not None]
    budget_key = f"train.{keys[0]}" if keys else "train.tokens"
    tokens = total_tokens(job)
    if tokens > MAX_TOKENS:
        raise JobCheckError(
            budget_key, f"{budget_key} makes {tokens:,} training tokens, more than any real "
            f"run ({MAX_TOKENS:,}): a typo?"
        )  # fmt: skip
    if t.global_batch_tokens > tokens:
        raise JobCheckError(
            ("train.global_batch_tokens", budget_key),
            f"train.global_batch_tokens={t.global_batch_tokens:,} is more than the trial's "
            f"budget of {tokens:,} tokens ({budget_key}): not one whole step; lower the batch "
            "or raise the budget",
        )
    check_schedule(total_steps(job), t)


def check_placement(job: JobConfig, world_size: int, device: str | None) -> BatchPlan:
    check_budget(job)
    check_downstream(job)
    if device is not None and job.train.dtype == "fp16" and not device.startswith("cuda"):
        raise JobCheckError(
            "train.dtype", "train.dtype='fp16' needs a GPU (refused on CPU); use bf16 or fp32"
        )
    t = job.train
    if job.deepspeed.zero_stage == 0 and t.grad_accum_dtype not in (None, t.dtype):
        raise JobCheckError(
            ("deepspeed.zero_stage", "train.grad_accum_dtype"),
            f"train.dtype={t.dtype!r} accumulates and reduces gradients in "
            f"train.grad_accum_dtype={t.grad_accum_dtype!r}, which DeepSpeed 0.19 does only "
            "in its ZeRO optimizers: set deepspeed.zero_stage to 1 (on one rank it holds "
            f"what stage 0 holds, with {t.grad_accum_dtype} gradients), or "
            f"train.grad_accum_dtype={t.dtype!r} (DeepSpeed's own, less exact default)",
        )
    return plan_batch(job, world_size)


def check_downstream(job: JobConfig) -> None:
    """eval.downstream's and eval.in_loop's local task files exist and parse (hub tasks are
    looked up when they run: lm-eval's index of them takes seconds to build)."""
    from scalelab.jobs.downstream.tasks import TaskError, specs

    for name, wanted in (("downstream", job.eval.downstream), ("in_loop", job.eval.in_loop)):
        if wanted is not None:
            try:
                specs(list(wanted.tasks))
            except TaskError as e:
                raise JobCheckError(f"eval.{name}.tasks", str(e)) from None


def check_environment(job: JobConfig, hub: bool = True) -> None:
    """`hub`: also resolve a hub dataset (jobs.data.trial.check_data); MissingData for data
    that is not here."""
    from scalelab.jobs.data.trial import check_data  # numpy and the tokenizers: only when checking

    try:
        check_data(job.data, job.model, hub=hub)
    except JobCheckError:
        raise
    except ValueError as e:  # its messages name their keys; else: the data section
        raise JobCheckError(_named_keys(str(e)) or "data", str(e)) from None


def preflight(job: JobConfig, world_size: int, device: str | None) -> BatchPlan:
    """All of the above; returns the batch plan."""
    plan = check_placement(job, world_size, device)
    check_environment(job)
    return plan


def _named_keys(message: str) -> tuple[str, ...]:
    """The JobConfig keys ('model.vocab_size') a message names, in order."""
    keys = []
    for match in _NAMED_KEY.finditer(message):
        section, _, field = match.group(1).partition(".")
        annotation = JobConfig.model_fields[section].annotation
        if field in getattr(annotation, "model_fields", {}) and match.group(1) not in keys:
            keys.append(match.group(1))
    return tuple(keys)
