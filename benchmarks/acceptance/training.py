"""The sweep's training steps against the planner, and the checkpoint round trip.

Two dense trials of sweeps/hadamard.yaml (bf16, ZeRO-1, fp32 gradient accumulation, the
sweep's micro-batch, no activation checkpointing) on one rank, one micro-batch per step (the
sweep's global batch needs 64 GPUs): 124M, and the largest ladder size the planner
(orchestrator/plan/planner.py) fits on this GPU, asked size by size from the largest down. Each
builds the job's own engine (jobs/training/train.py's `_Trainer`) and trains it on random tokens
held on the device (the data loader is not measured), against the plan of `scalelab submit
--dry-run` for the same trial on one rank:
- model-state bytes: every storage the engine holds after a backward pass
  (benchmarks/engine_memory.py) against the estimate of parameters + gradients + optimizer;
- GPU only: the CUDA peak of the timed steps (above what was allocated before the engine)
  against the plan's peak bytes per GPU;
- GPU only: the MFU (jobs/training/accounting.py) of the forward + backward pass, timed apart
  from the optimizer step, against the MFU the plan assumes (estimate.mfu, attention over
  the full T x T); the causal count and the whole step's MFU beside it. One rank has no
  all-reduce and an unsharded optimizer: the sweep's ranks step differently.
On the CPU, nano and micro stand in for 124M and the largest size. The 124M engine then
saves a checkpoint (jobs/training/checkpoint.py, as the job does) and a fresh engine resumes
from it: its parameters and optimizer state must equal the saved ones.
"""

from __future__ import annotations

import dataclasses
import gc
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from benchmarks.acceptance.checkpoint_round_trip import checkpoint_round_trip
from benchmarks.acceptance.checks import MEMORY_REL, NO_GPU, Check, memory, verdict, within
from benchmarks.engine_memory import held_bytes
from scalelab.jobs.config import JobConfig
from scalelab.jobs.gpus import device_gpu
from scalelab.jobs.training import distributed
from scalelab.jobs.training.accounting import device_peak_flops, mfu_metrics
from scalelab.jobs.training.distributed import DistEnv
from scalelab.jobs.training.ds_config import plan_batch
from scalelab.jobs.training.train import _Trainer
from scalelab.models.config import ModelConfig
from scalelab.models.flops import count_params, train_flops_per_token, train_flops_per_token_causal
from scalelab.orchestrator.plan.expand import Trial, expand
from scalelab.orchestrator.plan.memory import ZeroSettings, model_state_bytes, parameter_sizes
from scalelab.orchestrator.plan.planner import Placement, TrialPlan, plan_trial
from scalelab.orchestrator.plan.spec import SweepSpec, load_spec

SWEEP = Path(__file__).resolve().parents[2] / "sweeps" / "hadamard.yaml"
LARGEST = "largest size that fits"  # the rows' name for it: which size depends on the GPU


@dataclass(frozen=True)
class StepCase:
    """One sweep row's trial, run as `size`; None keeps the sweep's value. `label` names the
    rows in place of the sweep's size."""

    sweep_size: str
    size: str
    micro_batch: int | None = None
    seq_len: int | None = None
    vocab_size: int | None = None
    label: str | None = None


@dataclass(frozen=True)
class Largest:
    """The largest ladder size that fits: the planner chooses it on a GPU; `stand_in` runs
    where there is no GPU memory to ask the planner about (the CPU)."""

    stand_in: StepCase | None
    warmup: int
    steps: int  # fewer than the small cases': a multi-billion model's step costs far more


@dataclass(frozen=True)
class StepSizes:
    cases: tuple[StepCase, ...]  # the first also saves and resumes a checkpoint
    warmup: int  # steps before timing (allocator, kernels, Adam's moments)
    steps: int  # timed steps
    largest: Largest


GPU = StepSizes((StepCase("124M", "124M"),), warmup=3, steps=10, largest=Largest(None, 2, 5))
MICRO_FOR_LARGEST = StepCase("5.6B", "micro", 2, 32, 256, label=LARGEST)
CPU = StepSizes((StepCase("124M", "nano", 2, 32, 256),), 2, 2, Largest(MICRO_FOR_LARGEST, 2, 2))


@dataclass(frozen=True)
class Measured:
    """Timed steps of one rank, or of every rank (data_parallel.world_measurement)."""

    tokens_per_s: float  # over whole steps: forward, backward and optimizer step
    states_bytes: int  # what the engine holds after a backward pass
    peak_bytes: int | None  # CUDA peak over the timed steps, above what was held before
    forward_backward_s: float  # one micro-batch's forward + backward, mean
    optimizer_step_s: float  # one engine.step(), mean
    micro_batch_tokens: int  # the tokens of one micro-batch, on all ranks together


@dataclass(frozen=True)
class Utilisation:
    """MFU of the forward + backward pass and of the whole step (with the optimizer's), the
    attention's FLOPs counted over the full T x T (estimate.mfu's and perf/mfu's convention)
    and over the causal triangle (perf/mfu_causal): models/flops.py."""

    forward_backward: float
    forward_backward_causal: float
    step: float
    step_causal: float


def utilisation(m: Measured, model: ModelConfig, seq_len: int, world: int,
                peak: float | None) -> Utilisation | None:  # fmt: skip
    """`m`'s MFU on `world` devices of bf16 peak `peak`, as the job logs it (None: no peak)."""
    full = train_flops_per_token(model, seq_len)
    causal = train_flops_per_token_causal(model, seq_len)
    fb_rate = m.micro_batch_tokens / m.forward_backward_s  # tokens/s
    fb, step = (mfu_metrics(rate, full, causal, world, peak) for rate in (fb_rate, m.tokens_per_s))
    if not fb:  # no peak
        return None
    return Utilisation(
        fb["perf/mfu"], fb["perf/mfu_causal"], step["perf/mfu"], step["perf/mfu_causal"]
    )


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


# -- the largest size that fits ------------------------------------------------------------
@dataclass(frozen=True)
class SizeChoice:
    """The case run as the largest ladder size that fits, and why; `trial` and `plan` are
    None where none was chosen (`why` says why)."""

    case: StepCase
    trial: Trial | None
    plan: TrialPlan | None
    why: str


def ladder(spec: SweepSpec) -> list[str]:
    """The sweep's sizes, largest first (by their dense trials' parameter counts)."""
    params = {t.size: t.n_params for t in expand(spec) if t.variant == "dense"}
    return sorted(params, key=params.__getitem__, reverse=True)


def largest_fit(spec: SweepSpec, placement: Placement, steps: int) -> SizeChoice:
    """Ask the planner about each ladder size, largest first, as this part runs it (one
    rank, one micro-batch of the sweep's size per step, `steps` steps): the first that fits."""
    sizes, gpu, larger = ladder(spec), placement.gpu, []
    if gpu is None:
        why = "jobs/gpus.py has no memory for this GPU, so the planner cannot say what fits"
        return SizeChoice(StepCase("", "", label=LARGEST), None, None, why)
    for size in sizes:
        case = StepCase(size, size, label=LARGEST)
        trial = sweep_trial(case, spec, steps)
        plan = plan_trial(trial, spec, placement)
        if plan.fits and plan.usable_gpu_bytes is not None:
            why = (
                f"{size}: the largest ladder size ({', '.join(reversed(sizes))}) the planner "
                f"fits on one {gpu.name} at micro-batch {plan.micro_batch}: "
                f"{memory(plan.peak_gpu_bytes)} of {memory(plan.usable_gpu_bytes)} usable"
            )
            return SizeChoice(case, trial, plan, "; ".join([why, *larger]))
        larger.append(plan.problem or f"{size} needs {memory(plan.peak_gpu_bytes)}")
    why = f"no ladder size fits one {gpu.name}: {'; '.join(larger)}"
    return SizeChoice(StepCase("", "", label=LARGEST), None, None, why)


def stand_in(case: StepCase, spec: SweepSpec, placement: Placement, steps: int) -> SizeChoice:
    """`case` in place of the largest size that fits, where no GPU can choose it."""
    trial = sweep_trial(case, spec, steps)
    why = f"{case.size} stands in for the largest ladder size that fits a GPU (none here)"
    return SizeChoice(case, trial, plan_trial(trial, spec, placement), why)


# -- training steps ------------------------------------------------------------------------
def train_steps(trainer: _Trainer, warmup: int, steps: int, base_bytes: int) -> Measured:
    """`steps` steps of the built engine on fixed random tokens (device-resident) after
    `warmup` untimed ones, each micro-batch's forward + backward and each optimizer step
    timed apart with the device synchronised around them; the engine's states after one
    more backward. The CUDA peak is counted above `base_bytes`, what was allocated before
    the engine."""
    engine, plan, job, device = trainer.engine, trainer.plan, trainer.job, trainer.env.device
    cuda = device.startswith("cuda")
    sync: Callable[[], None] = torch.cuda.synchronize if cuda else (lambda: None)
    gen = torch.Generator().manual_seed(0)
    shape = (plan.micro_batch, job.data.seq_len)
    x, y = (torch.randint(0, job.model.vocab_size, shape, generator=gen).to(device) for _ in "xy")

    def step(measure_states: bool = False) -> tuple[float, float, int]:
        """(seconds of the micro-batches' forward + backward, of the optimizer step, the
        states held after the last backward or 0)"""
        held = 0
        sync()
        t0 = time.perf_counter()
        for micro in range(plan.accum):
            engine.backward(engine(x, y).loss)
            if measure_states and micro == plan.accum - 1:
                held, _ = held_bytes(engine)
        sync()
        t1 = time.perf_counter()
        engine.step()
        sync()
        return t1 - t0, time.perf_counter() - t1, held

    for _ in range(warmup):
        step()
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    timed = [step() for _ in range(steps)]
    peak = torch.cuda.max_memory_allocated(device) - base_bytes if cuda else None
    _, _, states = step(measure_states=True)
    forward_backward, optimizer = (sum(t[i] for t in timed) for i in (0, 1))
    micro_tokens = plan.micro_batch * job.data.seq_len
    return Measured(
        tokens_per_s=steps * plan.accum * micro_tokens / (forward_backward + optimizer),
        states_bytes=states,
        peak_bytes=peak,
        forward_backward_s=forward_backward / (steps * plan.accum),
        optimizer_step_s=optimizer / steps,
        micro_batch_tokens=micro_tokens,
    )


def states_estimate(trainer: _Trainer) -> int:
    """orchestrator/plan/memory.py's parameter + gradient + optimizer bytes for this engine's
    DeepSpeed config (what tests/orchestrator/test_memory_engines.py checks on 1 and 2 ranks)."""
    z = ZeroSettings.from_ds_config(trainer.ds_config)
    est = model_state_bytes(parameter_sizes(trainer.job.model), z, trainer.env.world_size)
    return est.resident + est.staging


# -- verdicts (no torch) -------------------------------------------------------------------
def case_name(case: StepCase, ranks: int = 1) -> str:
    as_size = f" (as {case.size})" if case.size != case.sweep_size else ""
    size = case.label or case.sweep_size
    return f"train {size}{as_size}" + (f" on {ranks} ranks" if ranks > 1 else "")


STATES_GOAL = (
    f"parameter + gradient + optimizer bytes the engine holds within {MEMORY_REL:.0%} of "
    "orchestrator/plan/memory.py's estimate"
)
PEAK_GOAL = f"CUDA peak of a training step within {MEMORY_REL:.0%} of the plan's peak per GPU"


def mfu_goal(assumed_mfu: float) -> str:
    return (
        f"forward + backward MFU >= {assumed_mfu:.0%}, the MFU the sweep's plan assumes "
        "(estimate.mfu), attention counted over the full T x T as estimate.mfu counts it; the "
        "causal count (perf/mfu_causal) and the whole step's MFU with its optimizer step beside it"
    )


def ranks_note(ranks: int) -> str:
    """How the measured step differs from the sweep's, whose ranks shard the optimizer."""
    if ranks > 1:
        return f"{ranks} ranks: gradients all-reduced, the optimizer sharded {ranks} ways (ZeRO-1)"
    return (
        "one rank: no all-reduce, and ZeRO-1 over one rank leaves the optimizer unsharded, "
        "so the multi-GPU plan is not what this checks"
    )


def step_checks(case: StepCase, m: Measured, plan: TrialPlan, states_est: int,
                assumed_mfu: float, achieved: Utilisation | None, why_no_mfu: str,
                ranks: int = 1, about: str = "") -> list[Check]:  # fmt: skip
    """The three checks of one case from its measurements (no torch: testable alone); on
    several ranks, `m` holds the largest memory of any rank and all ranks' tokens/s.
    `about` (which size this is, and why) ends each row."""
    name, tail = case_name(case, ranks), f"; {about}" if about else ""
    states = Check(
        f"{name}: model states vs planner", STATES_GOAL,
        verdict(within(m.states_bytes, states_est, MEMORY_REL)),
        f"engine {memory(m.states_bytes)}, estimate {memory(states_est)} "
        f"({states_est / m.states_bytes - 1:+.1%}){tail}",
    )  # fmt: skip
    note = ranks_note(ranks)
    if m.peak_bytes is None:
        peak = Check(f"{name}: peak memory vs planner", PEAK_GOAL, "skipped",
                     f"{NO_GPU}; {note}{tail}")  # fmt: skip
    else:
        est = plan.peak_gpu_bytes
        peak = Check(
            f"{name}: peak memory vs planner", PEAK_GOAL,
            verdict(within(m.peak_bytes, est, MEMORY_REL)),
            f"measured {memory(m.peak_bytes)}, plan {memory(est)} ({est / m.peak_bytes - 1:+.1%}), "
            f"micro-batch {plan.micro_batch}; {note}{tail}",
        )  # fmt: skip
    times = (
        f"forward + backward {m.forward_backward_s * 1e3:,.1f} ms per micro-batch of "
        f"{plan.micro_batch} sequences, optimizer step {m.optimizer_step_s * 1e3:,.1f} ms, "
        f"{m.tokens_per_s:,.0f} tokens/s; {note}{tail}"
    )
    if achieved is None:
        status, measured = "skipped", f"{why_no_mfu}; {times}"
    else:
        u = achieved
        status = verdict(u.forward_backward >= assumed_mfu)
        measured = (
            f"MFU of forward + backward {u.forward_backward:.1%} (causal "
            f"{u.forward_backward_causal:.1%}), of the whole step {u.step:.1%} (causal "
            f"{u.step_causal:.1%}); {times}"
        )
    return [states, peak, Check(f"{name}: MFU", mfu_goal(assumed_mfu), status, measured)]


def unmeasured_checks(case: StepCase, assumed_mfu: float, why: str,
                      out_of_memory: bool = False) -> list[Check]:  # fmt: skip
    """The case's three rows when its steps did not run, skipped saying why; running out
    of CUDA memory where the plan said it fits fails the peak row."""
    name, skipped = case_name(case), f"not measured: {why}"
    peak = ("fail", why) if out_of_memory else ("skipped", skipped)
    return [
        Check(f"{name}: model states vs planner", STATES_GOAL, "skipped", skipped),
        Check(f"{name}: peak memory vs planner", PEAK_GOAL, *peak),
        Check(f"{name}: MFU", mfu_goal(assumed_mfu), "skipped", skipped),
    ]


# -- the part ------------------------------------------------------------------------------
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


def case_checks(case: StepCase, trial: Trial, plan: TrialPlan, spec: SweepSpec, env: DistEnv,
                warmup: int, steps: int, checkpoint_to: Path | None = None,
                about: str = "") -> list[Check]:  # fmt: skip
    """One case built, trained and measured on this rank; with `checkpoint_to`, its engine
    then saves and resumes a checkpoint there. CUDA running out of memory fails the case's
    peak row, not the part."""
    try:
        trainer, base = build_trainer(trial.job, env)
        m = train_steps(trainer, warmup, steps, base)
    except torch.OutOfMemoryError as e:
        why = f"CUDA out of memory where the plan says {memory(plan.peak_gpu_bytes)} fits"
        why += f" ({str(e).splitlines()[0][:200]})" + (f"; {about}" if about else "")
        return unmeasured_checks(case, spec.estimate.mfu, why, out_of_memory=True)
    job = trial.job
    achieved = utilisation(m, job.model, job.data.seq_len, 1, device_peak_flops(env.device))
    cuda = env.device.startswith("cuda")
    why_no_mfu = NO_GPU if not cuda else f"no bf16 peak for {env.device} in jobs/gpus.py"
    checks = step_checks(case, m, plan, states_estimate(trainer), spec.estimate.mfu, achieved,
                         why_no_mfu, about=about)  # fmt: skip
    if checkpoint_to is not None:
        checks.append(checkpoint_round_trip(trainer, checkpoint_to, plan.checkpoint_bytes))
    return checks


def run(cpu: bool, out: Path) -> list[Check]:
    sizes = CPU if cpu else GPU
    spec, _ = load_spec(SWEEP)
    checks: list[Check] = []
    with process_group() as env:
        here = placement_here(env.device)
        for i, case in enumerate(sizes.cases):
            trial = sweep_trial(case, spec, sizes.warmup + sizes.steps + 1)
            plan = plan_trial(trial, spec, here)
            checkpoint_to = out / "ckpt" if i == 0 else None
            checks += case_checks(case, trial, plan, spec, env, sizes.warmup, sizes.steps,
                                  checkpoint_to)  # fmt: skip
        large, steps = sizes.largest, sizes.largest.warmup + sizes.largest.steps + 1
        if large.stand_in is None:
            choice = largest_fit(spec, here, steps)
        else:
            choice = stand_in(large.stand_in, spec, here, steps)
        if choice.trial is None or choice.plan is None:
            return checks + unmeasured_checks(choice.case, spec.estimate.mfu, choice.why)
        checks += case_checks(choice.case, choice.trial, choice.plan, spec, env, large.warmup,
                              large.steps, None, choice.why)  # fmt: skip
    return checks
