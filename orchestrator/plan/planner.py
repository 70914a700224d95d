"""The plan of each trial before anything runs (torch-free): bytes per GPU, host RAM per
node, checkpoint size, tokens to read and wall-clock time on the sweep's placement, whether
it fits its GPUs, and if not, the smallest change that does.

`submit --dry-run` shows it (`--json` carries every number); `submit` refuses a sweep with a
trial that does not fit before anything is created. The memory model is
orchestrator/plan/memory.py; GPU models and their peaks are jobs/gpus.py.

Time = training FLOPs (x 4/3 with activation checkpointing, which runs each forward twice)
plus the evaluations' forward FLOPs, divided by MFU x peak x GPUs. The assumptions (MFU,
headroom, attention kernel) are the sweep's `estimate:` section.
"""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import asdict, dataclass, replace
from typing import Any

from scalelab.contract.trial_time import duration_text
from scalelab.jobs.config import JobConfig
from scalelab.jobs.gpus import GpuSpec, gpu_spec
from scalelab.jobs.training.ds_config import deepspeed_config, plan_batch
from scalelab.models.flops import forward_flops_per_token
from scalelab.orchestrator.plan.cpu_rate import CpuRate
from scalelab.orchestrator.plan.expand import Trial
from scalelab.orchestrator.plan.memory import (
    GIB,
    Construction,
    ZeroSettings,
    activation_model,
    checkpoint_bytes,
    host_bytes_per_rank,
    model_state_bytes,
    parameter_sizes,
)
from scalelab.orchestrator.plan.spec import SweepSpec

MAX_NODES_FACTOR = 16  # the fix may multiply the nodes by up to this


def construction_mode(job: JobConfig) -> Construction:
    """How jobs/training/train.py builds the model on each rank: one module at a time drawn in fp32
    on the host, at every stage (on the GPU whole under ZeRO 0-2, models.build.build_materialised;
    partitioned across the ranks under ZeRO-3, models.build.build_partitioned)."""
    return "per_module"


@dataclass(frozen=True)
class Placement:
    """Where each trial runs: nodes x ranks, and the GPU model (None: unknown or CPU)."""

    nodes: int
    ranks_per_node: int
    gpus_per_node: int
    gpu: GpuSpec | None
    host_bytes: int | None  # host RAM per node the job may use, where the sweep says
    cpu: CpuRate | None = None  # without GPUs: what a rank computes (orchestrator/plan/cpu_rate.py)

    @property
    def world(self) -> int:
        return self.nodes * self.ranks_per_node

    @property
    def gpus(self) -> int:
        """GPUs in use: one per rank (a node's GPUs beyond its ranks stay idle)."""
        return self.nodes * min(self.gpus_per_node, self.ranks_per_node)

    @classmethod
    def of(cls, spec: SweepSpec, cpu: CpuRate | None = None) -> Placement:
        b = spec.backend  # what the backend's options say a trial gets
        gpu = gpu_spec(b.gpu) if b.gpu else None
        return cls(b.nodes, b.ranks_per_node, int(b.gpus_per_node), gpu, b.host_bytes_per_node, cpu)


@dataclass(frozen=True)
class Fix:
    """The smallest change that makes a trial fit: dotted sweep keys and their values."""

    changes: dict[str, Any]
    peak_gpu_bytes: int
    wall_s: float

    def describe(self) -> str:
        keys = ", ".join(
            f"{k}: {str(v).lower() if isinstance(v, bool) else v}" for k, v in self.changes.items()
        )
        return f"{keys} ({self.peak_gpu_bytes / GIB:.1f} GiB per GPU, {duration_text(self.wall_s)})"


@dataclass(frozen=True)
class TrialPlan:
    """One trial on one placement. Bytes are per GPU (one rank per GPU) unless named."""

    world: int
    gpus: int
    micro_batch: int
    accumulation: int
    zero_stage: int
    activation_checkpointing: bool
    params_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    buffers_bytes: int  # DeepSpeed's gradient buckets and staging buffers
    activations_bytes: int  # one micro-batch, at the start of the backward pass
    gathered_bytes: int  # ZeRO-3: parameters gathered for the layers being computed
    step_transient_bytes: int  # after the backward pass or during the optimizer step only
    peak_gpu_bytes: int
    usable_gpu_bytes: int | None  # the GPU's memory less the headroom; None: unknown
    offloaded_bytes: int  # per rank, in host RAM (optimizer offload)
    host_bytes_per_node: int
    checkpoint_bytes: int
    checkpoint_disk_bytes: int  # keep_checkpoints + the one being written
    read_tokens: int  # training tokens + the held-out validation tokens
    wall_s: float | None  # None without GPUs, unless the CPU's rate is known
    time_limit_slices: int | None  # SLURM jobs of slurm.time_min it takes (requeued in place)
    fits: bool | None  # None: no GPU model to compare with
    fix: Fix | None = None
    problem: str | None = None  # why there is no plan (e.g. the batch does not divide)

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["fix"] = None if self.fix is None else {**asdict(self.fix), "text": self.fix.describe()}
        return out


def plan_trial(
    trial: Trial,
    spec: SweepSpec,
    placement: Placement | None = None,
    fixes: dict[str, dict[str, Any] | None] | None = None,
) -> TrialPlan:
    """The plan of `trial` on `placement` (default: the sweep's), with a fix if it does
    not fit. `fixes` caches the search across trials that need the same memory (trials
    differing in seed, learning rate or tokens)."""
    placement = placement or Placement.of(spec)
    plan = _plan(trial, trial.job, spec, placement)
    if plan.fits is not False:
        return plan
    fixes = {} if fixes is None else fixes
    job = trial.job
    key = json.dumps(
        [job.model.model_dump(mode="json"), job.data.seq_len, job.train.global_batch_tokens,
         job.train.dtype, job.deepspeed.model_dump(mode="json")]
    )  # fmt: skip
    if key not in fixes:
        fixes[key] = smallest_fix(trial, spec, placement)
    changes = fixes[key]
    if changes is None:
        return plan
    moved = _moved(placement, changes, spec.backend.nodes_key)
    fitted = _plan(trial, _changed(job, changes), spec, moved)
    return replace(plan, fix=Fix(changes, fitted.peak_gpu_bytes, fitted.wall_s or 0.0))


def _plan(trial: Trial, job: JobConfig, spec: SweepSpec, placement: Placement) -> TrialPlan:
    est, world = spec.estimate, placement.world
    ds_opts = job.deepspeed
    try:
        batch = plan_batch(job, world)
    except ValueError as e:
        return _no_plan(trial, job, world, placement, str(e))
    device = "cuda" if placement.gpus else "cpu"
    z = ZeroSettings.from_ds_config(deepspeed_config(job, batch, device))
    sizes = parameter_sizes(job.model)
    states = model_state_bytes(sizes, z, world)
    seq = job.data.seq_len
    act = activation_model(
        job.model, seq, z.param_bytes, ds_opts.activation_checkpointing, est.attention, device
    ).bytes(batch.micro_batch * seq)
    resident = states.params + states.grads + states.optimizer + states.buffers
    peak = resident + max(act + states.gathered, states.step_transient)
    usable = None
    if placement.gpu is not None and placement.gpus:
        usable = int(placement.gpu.memory_bytes * (1 - est.memory_headroom))
    host = placement.ranks_per_node * host_bytes_per_rank(
        trial.n_params, world, construction_mode(job), states.host, max(parameter_sizes(job.model))
    )
    fits = None if usable is None else peak <= usable
    if fits and placement.host_bytes is not None:
        fits = host <= placement.host_bytes
    ckpt = checkpoint_bytes(trial.n_params, z)
    wall = _wall_s(trial, job, spec, placement)
    return TrialPlan(
        world=world,
        gpus=placement.gpus,
        micro_batch=batch.micro_batch,
        accumulation=batch.accum,
        zero_stage=z.stage,
        activation_checkpointing=ds_opts.activation_checkpointing,
        params_bytes=states.params,
        grads_bytes=states.grads,
        optimizer_bytes=states.optimizer,
        buffers_bytes=states.buffers,
        activations_bytes=act,
        gathered_bytes=states.gathered,
        step_transient_bytes=states.step_transient,
        peak_gpu_bytes=peak,
        usable_gpu_bytes=usable,
        offloaded_bytes=states.host,
        host_bytes_per_node=host,
        checkpoint_bytes=ckpt,
        checkpoint_disk_bytes=(job.train.keep_checkpoints + 1) * ckpt,
        read_tokens=trial.tokens + job.data.val_tokens,
        wall_s=wall,
        time_limit_slices=_slices(wall, spec),
        fits=fits,
    )


def _no_plan(trial: Trial, job: JobConfig, world: int, placement: Placement, why: str) -> TrialPlan:
    zero = dict.fromkeys(
        ("params_bytes", "grads_bytes", "optimizer_bytes", "buffers_bytes", "activations_bytes",
         "gathered_bytes", "step_transient_bytes", "peak_gpu_bytes", "offloaded_bytes",
         "host_bytes_per_node", "checkpoint_bytes", "checkpoint_disk_bytes"),
        0,
    )  # fmt: skip
    return TrialPlan(
        world=world, gpus=placement.gpus, micro_batch=0, accumulation=0,
        zero_stage=job.deepspeed.zero_stage,
        activation_checkpointing=job.deepspeed.activation_checkpointing,
        usable_gpu_bytes=None, read_tokens=trial.tokens + job.data.val_tokens, wall_s=None,
        time_limit_slices=None,
        fits=None, problem=why, **zero,
    )  # fmt: skip


def peak_flops(spec: SweepSpec, placement: Placement) -> float:
    """estimate.peak_flops, else the placement's GPU's peak, else the sweep's default."""
    if spec.estimate.peak_flops is None and placement.gpu is not None:
        return placement.gpu.bf16_flops
    return spec.peak_flops


def _wall_s(trial: Trial, job: JobConfig, spec: SweepSpec, placement: Placement) -> float | None:
    cpu = placement.cpu
    if not placement.gpus and cpu is None:
        return None
    recompute = 4 / 3 if job.deepspeed.activation_checkpointing else 1.0
    steps = math.ceil(trial.tokens / job.train.global_batch_tokens)
    evals = math.ceil(steps / job.train.eval_interval)
    fwd = forward_flops_per_token(job.model, job.data.seq_len).total
    flops = trial.flops * recompute + evals * job.data.val_tokens * fwd
    if not placement.gpus and cpu is not None:
        return flops / (cpu.mfu * cpu.flops * placement.world)
    return flops / (spec.estimate.mfu * peak_flops(spec, placement) * placement.gpus)


def _slices(wall_s: float | None, spec: SweepSpec) -> int | None:
    """The jobs of the backend's time limit a trial takes (it requeues itself after each)."""
    limit = spec.backend.time_limit_s
    if wall_s is None or limit is None:
        return None
    return max(1, math.ceil(wall_s / limit))


# ----------------------------------------------------------------------------- the fix


def _divisors_below(n: int, below: int) -> list[int]:
    return [k for k in range(below - 1, 0, -1) if n % k == 0]


def smallest_fix(trial: Trial, spec: SweepSpec, placement: Placement) -> dict[str, Any] | None:
    """The cheapest change that fits, as dotted sweep keys and values: fewest knobs changed
    first, then knobs in the order micro-batch (same computation, more accumulation steps),
    ZeRO stage (more communication, no more FLOPs), activation checkpointing (a third more
    FLOPs), nodes (more GPUs; where the backend has a key for them, `nodes_key`: SLURM's);
    within a knob the smallest step. None when nothing tried fits."""
    job, ds = trial.job, trial.job.deepspeed
    seqs = job.train.global_batch_tokens // job.data.seq_len
    micro_now = ds.micro_batch_size or max(1, seqs // placement.world)
    nodes = [placement.nodes * f for f in (2, 4, 8, MAX_NODES_FACTOR)]
    options = {
        "deepspeed.micro_batch_size": [None, *_divisors_below(seqs, micro_now)],
        "deepspeed.zero_stage": [None, *range(ds.zero_stage + 1, 4)],
        "deepspeed.activation_checkpointing": [None] + ([True] if not ds.activation_checkpointing else []),
    }  # fmt: skip
    if spec.backend.nodes_key:
        options[spec.backend.nodes_key] = [None, *nodes]
    best: tuple[tuple[Any, ...], dict[str, Any]] | None = None
    for combo in itertools.product(*options.values()):
        changes = {k: v for k, v in zip(options, combo, strict=True) if v is not None}
        if not changes:
            continue
        knobs = tuple(i for i, v in enumerate(combo) if v is not None)
        steps = tuple(options[k].index(v) for k, v in zip(options, combo, strict=True))
        cost = (len(changes), knobs, steps)
        if best is not None and cost >= best[0]:
            continue
        moved = _moved(placement, changes, spec.backend.nodes_key)
        if _plan(trial, _changed(job, changes), spec, moved).fits:
            best = (cost, changes)
    return None if best is None else best[1]


def _changed(job: JobConfig, changes: dict[str, Any]) -> JobConfig:
    update = {k.split(".")[1]: v for k, v in changes.items() if k.startswith("deepspeed.")}
    return job.model_copy(update={"deepspeed": job.deepspeed.model_copy(update=update)})


def _moved(placement: Placement, changes: dict[str, Any], nodes_key: str | None) -> Placement:
    return replace(placement, nodes=changes.get(nodes_key or "", placement.nodes))


def plan_sweep(spec: SweepSpec, trials: list[Trial], cpu: CpuRate | None = None) -> list[TrialPlan]:
    """`cpu`: the rate of a CPU rank, for the wall time of a sweep without GPUs."""
    placement, fixes = Placement.of(spec, cpu), {}
    return [plan_trial(t, spec, placement, fixes) for t in trials]


# ----------------------------------------------------------------------------- display


def _gib(n: int) -> str:
    return f"{n / GIB:.1f}"


def plan_cells(plan: TrialPlan) -> dict[str, str]:
    """The dry-run table's plan columns of one trial."""
    if plan.problem:
        return dict.fromkeys(PLAN_COLUMNS, "-") | {"fits": "no plan"}
    fits = {True: "yes", False: "NO", None: "?"}[plan.fits]
    return {
        "GiB/GPU": _gib(plan.peak_gpu_bytes),
        "fits": fits,
        "wall": "-" if plan.wall_s is None else duration_text(plan.wall_s),
        "host GiB/node": _gib(plan.host_bytes_per_node),
        "ckpt GB": f"{plan.checkpoint_bytes / 1e9:.1f}",
    }


PLAN_COLUMNS = ("GiB/GPU", "fits", "wall", "host GiB/node", "ckpt GB")
# Without GPUs: no memory per GPU, nothing to fit it to (--json keeps every number)
GPU_ONLY_COLUMNS = ("GiB/GPU", "fits")
CPU_PLAN_COLUMNS = tuple(c for c in PLAN_COLUMNS if c not in GPU_ONLY_COLUMNS)


def plan_columns(on_cpu: bool) -> tuple[str, ...]:
    """The dry-run table's plan columns: a sweep whose trials run without GPUs leaves out
    those that only mean something on a GPU."""
    return CPU_PLAN_COLUMNS if on_cpu else PLAN_COLUMNS


def placement_summary(spec: SweepSpec, placement: Placement | None = None) -> str:
    p = placement or Placement.of(spec)
    where = f"{p.nodes} node(s) x {p.ranks_per_node} rank(s)"
    if not p.gpus:
        rate = (
            f"; wall time (training only: starting a trial takes seconds more) at {p.cpu.describe()}"
            if p.cpu
            else ""
        )
        return f"each trial: {where}, no GPUs (host RAM per node shown){rate}"
    if p.gpu is None:
        gpu = f"{p.gpus} GPU(s) of an unnamed model (set backend.gpu to check memory)"
    else:
        usable = p.gpu.memory_gib * (1 - spec.estimate.memory_headroom)
        gpu = f"{p.gpus} x {p.gpu.name} ({usable:.1f} GiB usable of {p.gpu.memory_gib:g})"
    return f"each trial: {where}, {gpu}; wall time at MFU {spec.estimate.mfu:.0%}"


def unfit_lines(trials: list[Trial], plans: list[TrialPlan]) -> list[str]:
    """One line per trial that does not fit: what it needs, and the smallest change."""
    lines = []
    for t, p in zip(trials, plans, strict=True):
        if p.fits is not False:
            continue
        if p.usable_gpu_bytes is not None and p.peak_gpu_bytes > p.usable_gpu_bytes:
            need = (
                f"needs {_gib(p.peak_gpu_bytes)} GiB per GPU of {_gib(p.usable_gpu_bytes)} usable "
                f"(parameters {_gib(p.params_bytes)}, gradients {_gib(p.grads_bytes)}, optimizer "
                f"{_gib(p.optimizer_bytes)}, activations {_gib(p.activations_bytes)} at "
                f"micro-batch {p.micro_batch}, buffers {_gib(p.buffers_bytes + p.gathered_bytes)})"
            )
        else:
            need = f"needs {_gib(p.host_bytes_per_node)} GiB of host RAM per node (slurm.mem_gb)"
        fix = (
            p.fix.describe()
            if p.fix
            else "no change of micro-batch, checkpointing, ZeRO stage or nodes fits"
        )
        lines.append(
            f"{t.trial_id} ({t.size} {t.variant}) {need}; smallest change that fits: {fix}"
        )
    return lines
