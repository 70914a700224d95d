"""bf16 vs fp32 loss curves of the training job itself (`jobs.training.train.run`, in this process):
the same trial in both dtypes, the mean |difference| of the logged losses over the steps."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from benchmarks.acceptance.checks import Check, verdict
from scalelab.jobs.config import JobConfig
from scalelab.jobs.environ import scoped_environ
from scalelab.jobs.tracking.tracker import TRACKING_VAR


@dataclass(frozen=True)
class LossSizes:
    """What the comparison trains: the CPU path's nano model, or the sweeps' 124M."""

    model: dict
    data: dict
    steps: int
    batch_tokens: int
    max_gap: float  # mean |bf16 - fp32| loss over the steps


CPU = LossSizes(
    model={"size": "nano", "vocab_size": 256, "block_size": 32},
    data={"source": "builtin:pydoc", "seq_len": 32, "val_tokens": 256},
    steps=12,
    batch_tokens=256,
    max_gap=0.02,
)
GPU = LossSizes(
    model={"size": "124M", "vocab_size": 50257, "block_size": 1024},
    data={"source": "builtin:pydoc", "tokenizer": "gpt2", "seq_len": 1024, "val_tokens": 65536},
    steps=50,
    batch_tokens=8 * 1024,
    max_gap=0.02,
)


def train(sizes: LossSizes, dtype: str, out: Path) -> tuple[list[float], float]:
    """Train once in `dtype` with the job's own entry point; its losses and wall time, read
    from curves.jsonl with tracking off: no MLflow is needed (a GPU node's own Python has
    none) and none is waited for."""
    from scalelab.jobs.training.train import run

    job = JobConfig.model_validate({
        "model": sizes.model,
        "data": sizes.data,
        "train": {"tokens": sizes.steps * sizes.batch_tokens, "lr": 3e-3, "dtype": dtype,
                  "global_batch_tokens": sizes.batch_tokens, "log_interval": 1,
                  "eval_interval": 10**6, "checkpoint_interval": 10**6},
        "deepspeed": {"zero_stage": 1},
    })  # fmt: skip
    home = out / "home"
    env = {"SCALELAB_HOME": str(home), "SCALELAB_EXPERIMENT": "gpu-acceptance", TRACKING_VAR: "off"}
    with scoped_environ(env):
        result = run(job)
    rows = [json.loads(line) for line in (home / "trials" / job.trial_id / "curves.jsonl").open()]
    return [r["value"] for r in rows if r["metric"] == "train/loss"], result.wall_time_s


def loss_check(
    sizes: LossSizes, fp32: list[float], bf16: list[float], seconds: tuple[float, float]
) -> Check:
    goal = f"{sizes.steps} steps of {sizes.model['size']}: mean abs(bf16 - fp32) loss <= {sizes.max_gap}"
    if len(fp32) != sizes.steps or len(bf16) != sizes.steps:
        return Check("loss bf16 vs fp32", goal, "fail", f"{len(fp32)}/{len(bf16)} steps logged")
    gap = sum(abs(a - b) for a, b in zip(fp32, bf16, strict=True)) / sizes.steps
    measured = (f"{gap:.4f} (final {fp32[-1]:.4f} vs {bf16[-1]:.4f}; "
                f"{seconds[0]:.0f} s / {seconds[1]:.0f} s)")  # fmt: skip
    return Check("loss bf16 vs fp32", goal, verdict(gap <= sizes.max_gap), measured)


def run(cpu: bool, out: Path) -> list[Check]:
    sizes = CPU if cpu else GPU
    fp32, t32 = train(sizes, "fp32", out)
    bf16, t16 = train(sizes, "bf16", out)
    return [loss_check(sizes, fp32, bf16, (t32, t16))]
