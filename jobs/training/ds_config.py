"""The DeepSpeed config of one trial, generated from DeepSpeedConfig + TrainConfig
(torch-free: the orchestrator plans each trial's batch and its memory from the same config
before anything runs)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from scalelab.jobs.config import JobCheckError, JobConfig


@dataclass(frozen=True)
class BatchPlan:
    """global batch (sequences) = micro_batch x world_size x accumulation steps."""

    global_seqs: int
    micro_batch: int
    accum: int
    world_size: int


def plan_batch(job: JobConfig, world_size: int) -> BatchPlan:
    """Split the global batch (whole sequences: JobConfig checks the division) across
    `world_size` ranks and micro-batches."""
    seqs = job.train.global_batch_tokens // job.data.seq_len
    if seqs % world_size:
        raise JobCheckError(
            ("train.global_batch_tokens", "data.seq_len"),
            f"the global batch of {seqs} sequences (train.global_batch_tokens / data.seq_len) "
            f"does not divide across {world_size} ranks",
        )
    micro = job.deepspeed.micro_batch_size or seqs // world_size
    if seqs % (micro * world_size):
        raise JobCheckError(
            ("deepspeed.micro_batch_size", "train.global_batch_tokens"),
            f"the global batch of {seqs} sequences is not micro_batch_size ({micro}) x "
            f"{world_size} ranks x an integer number of accumulation steps",
        )
    return BatchPlan(seqs, micro, seqs // (micro * world_size), world_size)


def deep_merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def deepspeed_config(job: JobConfig, plan: BatchPlan, device: str) -> dict[str, Any]:
    """`device`: 'cpu' or 'cuda[:i]' (pinned host buffers only for a GPU).

    With bf16 or fp16, gradients are accumulated and reduced in `train.grad_accum_dtype`
    (fp32 unless a trial asks otherwise): DeepSpeed 0.19 does that under ZeRO 1-3 (ZeRO-1:
    BF16_Optimizer's fp32 gradient buffer, or each parameter's fp32 `grad_accum` with
    offload; ZeRO-2/3: fp32 gradient partitions) and refuses it at stage 0
    (jobs/checks.py). Reduction scatters gradients in the communication dtype, so that is
    set too. `overlap_comm` lets ZeRO reduce gradient buckets while the backward pass runs;
    `reduce_bucket_size` decides their size (orchestrator/plan/memory.py counts them).

    BF16_Optimizer runs with `immediate_grad_update`: each bf16 gradient is added into the
    fp32 buffer as the backward pass produces it and freed, 2 bytes per parameter less than
    adding them after each backward pass (tests/jobs/test_gradient_settings.py checks both
    ways sum each micro-batch once: the second relies on DeepSpeed's backward prologue,
    which finds the model's output tensors because ModelOutput is a tuple).
    `deepspeed.extra` cannot change any of the numerics (JobConfig refuses it)."""
    ds, t = job.deepspeed, job.train
    zero: dict[str, Any] = {"stage": ds.zero_stage, "overlap_comm": ds.overlap_comm}
    if ds.reduce_bucket_size is not None:
        zero["reduce_bucket_size"] = ds.reduce_bucket_size
    bf16_optimizer = (  # what DeepSpeed's engine picks (_do_optimizer_sanity_check)
        t.dtype == "bf16" and t.grad_accum_dtype == "fp32" and ds.zero_stage == 1
        and not ds.offload_optimizer
    )  # fmt: skip
    if ds.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": device != "cpu"}
    cfg: dict[str, Any] = {
        "train_batch_size": plan.global_seqs,
        "train_micro_batch_size_per_gpu": plan.micro_batch,
        "gradient_accumulation_steps": plan.accum,
        "gradient_clipping": t.grad_clip,
        "zero_optimization": zero,
        "bf16": {"enabled": t.dtype == "bf16"}
        | ({"immediate_grad_update": True} if bf16_optimizer else {}),
        "fp16": {"enabled": t.dtype == "fp16", "initial_scale_power": 12},
        # the optimizer is torch's AdamW (DeepSpeed's Adam JIT-compiles for 70-100 s)
        "zero_allow_untested_optimizer": True,
        "zero_force_ds_cpu_optimizer": False,
        "steps_per_print": 2**31 - 1,
        "wall_clock_breakdown": False,
    }
    if t.grad_accum_dtype is not None:  # bf16 / fp16 models
        cfg["data_types"] = {"grad_accum_dtype": t.grad_accum_dtype}
        cfg["communication_data_type"] = t.grad_accum_dtype
    return deep_merge(cfg, ds.extra)
