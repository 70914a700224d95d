"""The sweeps' training steps against the planner, and the checkpoint round trip.

Each case takes the dense trial of one size from sweeps/hadamard.yaml (bf16, ZeRO-1, fp32
gradient accumulation, its micro-batch, no activation checkpointing) on one rank, with one
micro-batch per step (the sweep's global batch needs 64 GPUs), builds the job's own engine
(jobs/training/train.py's `_Trainer`) and trains it on random tokens held on the device (the data
loader is not what is measured). Compared with the planner of `scalelab submit --dry-run`
(orchestrator/planner.py, orchestrator/memory.py) for the same trial on one rank:
- model-state bytes: every storage the engine holds after a backward pass
  (benchmarks/engine_memory.py) against the estimate of parameters + gradients + optimizer;
- GPU only: the CUDA peak during the timed steps (torch.cuda.max_memory_allocated, less
  what was allocated before the engine was built) against the plan's peak bytes per GPU;
- GPU only: MFU (jobs/training/accounting.py: model FLOPs per second over the device's bf16 peak,
  FLOPs from models/flops.py) against the MFU the sweep's plan assumes (estimate.mfu).
On the CPU the same code runs nano and micro models in place of 124M and 1.3B.
The first case's engine then saves a checkpoint (jobs/training/checkpoint.py, as the job does) and a
fresh engine resumes from it: its parameters and optimizer state must equal the saved ones.
"""

from __future__ import annotations

import dataclasses
import gc
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from benchmarks.acceptance.checks import NO_GPU, Check, memory, verdict, within
from benchmarks.engine_memory import held_bytes
from scalelab.jobs.config import JobConfig
from scalelab.jobs.gpus import device_gpu
from scalelab.jobs.training import checkpoint, distributed
from scalelab.jobs.training.accounting import device_peak_flops, mfu
from scalelab.jobs.training.distributed import DistEnv
from scalelab.jobs.training.ds_config import plan_batch
from scalelab.jobs.training.train import _Trainer
from scalelab.models.flops import count_params, train_flops_per_token
from scalelab.orchestrator.expand import Trial, expand
from scalelab.orchestrator.memory import ZeroSettings, model_state_bytes, parameter_sizes
from scalelab.orchestrator.planner import Placement, TrialPlan, plan_trial
from scalelab.orchestrator.spec import SweepSpec, load_spec

SWEEP = Path(__file__).resolve().parents[2] / "sweeps" / "hadamard.yaml"
MEMORY_REL = 0.10  # the planner's stated accuracy (orchestrator/memory.py)


@dataclass(frozen=True)
class StepCase:
    """One sweep row's trial, run as `size`; None keeps the sweep's value."""

    sweep_size: str
    size: str
    micro_batch: int | None = None
    seq_len: int | None = None
    vocab_size: int | None = None


@dataclass(frozen=True)
class StepSizes:
    cases: tuple[StepCase, ...]
    warmup: int  # steps before timing (allocator, kernels, Adam's moments)
    steps: int  # timed steps


GPU = StepSizes((StepCase("124M", "124M"), StepCase("1.3B", "1.3B")), warmup=3, steps=10)
CPU = StepSizes(
    (StepCase("124M", "nano", 2, 32, 256), StepCase("1.3B", "micro", 2, 32, 256)),
    warmup=2,
    steps=2,
)


@dataclass(frozen=True)
class Measured:
    tokens_per_s: float
    states_bytes: int  # what the engine holds after a backward pass
    peak_bytes: int | None  # CUDA peak over the timed steps, above what was held before


def sweep_trial(case: StepCase, spec: SweepSpec, steps: int, ranks: int = 1) -> Trial:
    """The sweep's dense trial of `case.sweep_size`, one micro-batch per rank and step on
    `ranks` data-parallel ranks, `steps` steps."""
    trial = next(t for t in expand(spec) if t.size == case.sweep_size and t.variant == "dense")
    raw = trial.job.model_dump(mode="json")
    seq = case.seq_len or raw["data"]["seq_len"]
    micro = case.micro_batch or raw["deepspeed"]["micro_batch_size"]
    for shape in ("n_layer", "d_model", "n_head"):  # resolved from the sweep's preset
        raw["model"].pop(shape)
    raw["model"]["size"] = case.size
    if case.vocab_size:
        raw["model"]["vocab_size"] = case.vocab_size
    if case.seq_len:
        raw["model"]["block_size"] = case.seq_len
    raw["data"] |= {"seq_len": seq, "val_tokens": seq}
    batch = ranks * micro * seq
    raw["train"] |= {"global_batch_tokens": batch, "tokens": steps * batch}
    raw["deepspeed"]["micro_batch_size"] = micro
    job = JobConfig.model_validate(raw)
    tokens = job.train.tokens
    flops = tokens * train_flops_per_token(job.model, seq)
    return dataclasses.replace(
        trial, job=job, trial_id=job.trial_id, size=case.size, n_params=count_params(job.model),
        n_nonembed=count_params(job.model, non_embedding=True), tokens=tokens, flops=flops,
    )  # fmt: skip


def placement_here(device: str, ranks: int = 1) -> Placement:
    """This machine as the planner sees it: `ranks` ranks on one node, each on a GPU like
    this process's (None if unknown) or on none."""
    if not device.startswith("cuda"):
        return Placement(1, ranks, 0, None, None)
    return Placement(1, ranks, ranks, device_gpu(torch.cuda.get_device_name(device)), None)


def train_steps(trainer: _Trainer, sizes: StepSizes, base_bytes: int) -> Measured:
    """Steps of the built engine on fixed random tokens (device-resident), timed after a
    warm-up with the device synchronised; the engine's states after one more backward. The
    CUDA peak is counted above `base_bytes`, what was allocated before the engine."""
    engine, plan, job, device = trainer.engine, trainer.plan, trainer.job, trainer.env.device
    cuda = device.startswith("cuda")
    sync: Callable[[], None] = torch.cuda.synchronize if cuda else (lambda: None)
    gen = torch.Generator().manual_seed(0)
    shape = (plan.micro_batch, job.data.seq_len)
    x, y = (torch.randint(0, job.model.vocab_size, shape, generator=gen).to(device) for _ in "xy")

    def step(measure_states: bool = False) -> int:
        held = 0
        for micro in range(plan.accum):
            engine.backward(engine(x, y).loss)
            if measure_states and micro == plan.accum - 1:
                held, _ = held_bytes(engine)
        engine.step()
        return held

    for _ in range(sizes.warmup):
        step()
    sync()
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    t0 = time.perf_counter()
    for _ in range(sizes.steps):
        step()
    sync()
    seconds = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated(device) - base_bytes if cuda else None
    states = step(measure_states=True)
    tokens = sizes.steps * plan.accum * plan.micro_batch * job.data.seq_len
    return Measured(tokens / seconds, states, peak)


def states_estimate(trainer: _Trainer) -> int:
    """orchestrator/memory.py's parameter + gradient + optimizer bytes for this engine's
    DeepSpeed config (what tests/orchestrator/test_memory_engines.py checks on 1 and 2 ranks)."""
    z = ZeroSettings.from_ds_config(trainer.ds_config)
    est = model_state_bytes(parameter_sizes(trainer.job.model), z, trainer.env.world_size)
    return est.resident + est.staging


def case_name(case: StepCase, ranks: int = 1) -> str:
    as_size = f" (as {case.size})" if case.size != case.sweep_size else ""
    return f"train {case.sweep_size}{as_size}" + (f" on {ranks} ranks" if ranks > 1 else "")


def step_checks(case: StepCase, m: Measured, plan: TrialPlan, states_est: int,
                assumed_mfu: float, achieved_mfu: float | None, why_no_mfu: str,
                ranks: int = 1) -> list[Check]:  # fmt: skip
    """The three checks of one case from its measurements (no torch: testable alone); on
    several ranks, `m` holds the largest memory of any rank and all ranks' tokens/s."""
    name = case_name(case, ranks)
    rel = f"{MEMORY_REL:.0%}"
    states = Check(
        f"{name}: model states vs planner",
        f"parameter + gradient + optimizer bytes the engine holds within {rel} of "
        "orchestrator/memory.py's estimate",
        verdict(within(m.states_bytes, states_est, MEMORY_REL)),
        f"engine {memory(m.states_bytes)}, estimate {memory(states_est)} "
        f"({states_est / m.states_bytes - 1:+.1%})",
    )
    peak_goal = f"CUDA peak of a training step within {rel} of the plan's peak per GPU"
    if m.peak_bytes is None:
        peak = Check(f"{name}: peak memory vs planner", peak_goal, "skipped", NO_GPU)
    else:
        est = plan.peak_gpu_bytes
        peak = Check(
            f"{name}: peak memory vs planner", peak_goal,
            verdict(within(m.peak_bytes, est, MEMORY_REL)),
            f"measured {memory(m.peak_bytes)}, plan {memory(est)} ({est / m.peak_bytes - 1:+.1%}), "
            f"micro-batch {plan.micro_batch}",
        )  # fmt: skip
    mfu_goal = f"MFU >= {assumed_mfu:.0%}, the MFU the sweep's plan assumes (estimate.mfu)"
    tok = f"{m.tokens_per_s:,.0f} tokens/s"
    if achieved_mfu is None:
        mfu_check = Check(f"{name}: MFU", mfu_goal, "skipped", f"{why_no_mfu}; {tok}")
    else:
        mfu_check = Check(f"{name}: MFU", mfu_goal, verdict(achieved_mfu >= assumed_mfu),
                          f"{achieved_mfu:.1%} ({tok})")  # fmt: skip
    return [states, peak, mfu_check]


@contextmanager
def process_group() -> Iterator[DistEnv]:
    """This process's rank (jobs.training.distributed: a world of one unless a launcher set RANK and
    WORLD_SIZE), its process group shut down afterwards."""
    env = distributed.read_environment()
    distributed.init(env)
    try:
        yield env
    finally:
        distributed.shutdown(env)


def build_trainer(job: JobConfig, env: DistEnv) -> tuple[_Trainer, int]:
    """The job's own engine (model build, DeepSpeed config, optimizer) as jobs/training/train.py
    makes it, and the CUDA bytes allocated before it was built (0 on the CPU)."""
    cuda = env.device.startswith("cuda")
    if cuda:  # what earlier checks left is freed now, not during the measured steps
        gc.collect()
        torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated(env.device) if cuda else 0
    trainer = _Trainer(job, env, plan_batch(job, env.world_size), time.time())
    trainer._build_engine()
    return trainer, base


def run(cpu: bool, out: Path) -> list[Check]:
    sizes = CPU if cpu else GPU
    spec, _ = load_spec(SWEEP)
    checks: list[Check] = []
    with process_group() as env:
        peak_flops = device_peak_flops(env.device)
        why = NO_GPU if cpu else f"no bf16 peak for {env.device} in jobs/gpus.py"
        for i, case in enumerate(sizes.cases):
            trial = sweep_trial(case, spec, sizes.warmup + sizes.steps + 1)
            plan = plan_trial(trial, spec, placement_here(env.device))
            trainer, base = build_trainer(trial.job, env)
            m = train_steps(trainer, sizes, base)
            flops = m.tokens_per_s * train_flops_per_token(trial.job.model, trial.job.data.seq_len)
            achieved = mfu(flops, env.world_size, peak_flops)
            checks += step_checks(case, m, plan, states_estimate(trainer), spec.estimate.mfu,
                                  achieved, why)  # fmt: skip
            if i == 0:
                checks.append(checkpoint_round_trip(trainer, out / "ckpt", plan.checkpoint_bytes))
            del trainer
            if not cpu:
                torch.cuda.empty_cache()
    return checks


# -- checkpoint ---------------------------------------------------------------------------
def engine_state(engine: Any) -> dict[str, Any]:
    """The module's parameters and the optimizer's state, flattened to path -> value, on
    the host (what a resume must restore)."""
    flat: dict[str, Any] = {}

    def walk(obj: Any, path: str) -> None:
        if isinstance(obj, torch.Tensor):
            flat[path] = obj.detach().to("cpu", copy=True)
        elif isinstance(obj, dict):
            for k, v in obj.items():
                walk(v, f"{path}.{k}")
        elif isinstance(obj, (list, tuple)):
            for i, v in enumerate(obj):
                walk(v, f"{path}[{i}]")
        elif isinstance(obj, (int, float, str, bool)) or obj is None:
            flat[path] = obj

    walk(engine.module.state_dict(), "module")
    walk(engine.optimizer.state_dict(), "optimizer")
    return flat


def differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """Paths whose values differ (tensors bit for bit, dtype and shape included)."""
    found = sorted(set(a) ^ set(b))
    for path in sorted(set(a) & set(b)):
        x, y = a[path], b[path]
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            same = x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y)
        else:
            same = type(x) is type(y) and x == y
        if not same:
            found.append(path)
    return found


def checkpoint_round_trip(trainer: _Trainer, folder: Path, estimate: int) -> Check:
    """Save the trained engine as the job does, build a fresh engine (initial weights) and
    resume it from the checkpoint; time both and compare their states."""
    env = trainer.env
    sync = torch.cuda.synchronize if env.device.startswith("cuda") else (lambda: None)
    goal = (
        "a fresh engine resumed from the saved checkpoint holds bit-identical parameters and "
        f"optimizer state; files within {MEMORY_REL:.0%} of the planner's checkpoint size; "
        "save and load seconds and GB/s reported"
    )
    saved = engine_state(trainer.engine)
    sync()
    t0 = time.perf_counter()
    tag = checkpoint.save(trainer.engine, env, folder, {"step": 1}, keep=1)
    sync()
    save_s = time.perf_counter() - t0
    nbytes = sum(p.stat().st_size for p in tag.iterdir() if p.is_file())
    trainer._build_engine()  # initial weights, fresh optimizer
    # the load must change the weights (a fresh optimizer differs anyway: no moments yet)
    untrained = [p for p in differences(engine_state(trainer.engine), saved) if "module." in p]
    sync()
    t0 = time.perf_counter()
    resumed = checkpoint.resume(trainer.engine, env, folder)
    sync()
    load_s = time.perf_counter() - t0
    diff = differences(engine_state(trainer.engine), saved)
    ok = resumed.state is not None and not diff and bool(untrained)
    ok = ok and within(nbytes, estimate, MEMORY_REL)
    gb = nbytes / 1e9
    measured = (
        f"{gb:.3f} GB (plan {estimate / 1e9:.3f}): save {save_s:.2f} s ({gb / save_s:.2f} GB/s), "
        f"verify + load {load_s:.2f} s ({gb / load_s:.2f} GB/s); "
        + (f"{len(diff)} differ, e.g. {diff[0]}" if diff else f"{len(saved)} tensors/values equal")
        + ("" if untrained else "; the fresh engine's weights already equalled the saved ones")
        + ("" if resumed.state is not None else f"; not resumed: {resumed.skipped}")
    )
    return Check("checkpoint save and load", goal, verdict(ok), measured)
