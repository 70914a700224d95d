"""The planner's numbers for the 124M -> 5.6B ladder (sweeps/hadamard.yaml, dense trials):
the tables of docs/running-on-slurm.md, "Planning: memory, time and what fits where".

    python benchmarks/plan_ladder.py

Nothing is measured: every number is orchestrator/plan/planner.py's estimate (the memory model is
checked against real engines on CPU by tests/orchestrator/test_memory_*.py).
"""

from __future__ import annotations

from dataclasses import replace

from scalelab.jobs.gpus import GPUS
from scalelab.orchestrator.plan.expand import Trial, expand
from scalelab.orchestrator.plan.memory import GIB
from scalelab.orchestrator.plan.planner import Placement, duration_text, plan_trial
from scalelab.orchestrator.plan.spec import SweepSpec, load_spec

GPU_CHOICES = ("RTX 4090", "L40S", "A100 40GB", "H100 SXM", "H200")
MAX_MICRO = 32  # larger micro-batches buy little utilisation


def _gib(n: int) -> str:
    return f"{n / GIB:.1f}"


def _with_micro(trial: Trial, micro: int) -> Trial:
    ds = trial.job.deepspeed.model_copy(update={"micro_batch_size": micro})
    return replace(trial, job=trial.job.model_copy(update={"deepspeed": ds}))


def ladder_table(spec: SweepSpec, dense: list[Trial]) -> None:
    place = Placement.of(spec)
    one_node = replace(place, nodes=1)
    print(
        f"\n{place.nodes} nodes x {place.gpus_per_node} {place.gpu.name}, ZeRO-1, bf16, MFU 40%:\n"
    )
    print(
        "| size | params | micro-batch x accum | params + grads + optimizer | activations "
        "| buckets | peak / GPU | host RAM / node | checkpoint | wall, 8 nodes | wall, 1 node |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for t in dense:
        p = plan_trial(t, spec, place)
        one = plan_trial(t, spec, one_node)
        states = p.params_bytes + p.grads_bytes + p.optimizer_bytes
        print(
            f"| {t.size} | {t.n_params / 1e9:.2f}B | {p.micro_batch} x {p.accumulation} "
            f"| {_gib(states)} GiB | {_gib(p.activations_bytes)} GiB | {_gib(p.buffers_bytes)} GiB "
            f"| {_gib(p.peak_gpu_bytes)} GiB | {_gib(p.host_bytes_per_node)} GiB "
            f"| {p.checkpoint_bytes / 1e9:.1f} GB | {duration_text(p.wall_s)} "
            f"| {duration_text(one.wall_s)} |"
        )


def fits_table(spec: SweepSpec, dense: list[Trial], nodes: int) -> None:
    where = replace(Placement.of(spec), nodes=nodes)
    print(
        f"\nOn {nodes} node(s) x {where.gpus_per_node} GPUs, ZeRO-1: the largest micro-batch up "
        f"to {MAX_MICRO} without activation checkpointing (peak GiB per GPU), else the "
        "planner's smallest change:\n"
    )
    print("| size | " + " | ".join(f"{g} ({GPUS[g].memory_gib:g} GiB)" for g in GPU_CHOICES) + " |")
    print("|---|" + "---|" * len(GPU_CHOICES))
    for t in dense:
        share = t.job.train.global_batch_tokens // t.job.data.seq_len // where.world
        cells = []
        for name in GPU_CHOICES:
            place = replace(where, gpu=GPUS[name])
            best = None
            for micro in (m for m in range(min(share, MAX_MICRO), 0, -1) if share % m == 0):
                plan = plan_trial(_with_micro(t, micro), spec, place)
                if plan.fits:
                    best = f"{micro} ({_gib(plan.peak_gpu_bytes)})"
                    break
            if best is None:
                fix = plan_trial(t, spec, place).fix  # from the sweep's micro-batch
                best = fix.describe() if fix else "does not fit"
            cells.append(best)
        print(f"| {t.size} | " + " | ".join(cells) + " |")


def main() -> None:
    spec, source = load_spec("sweeps/hadamard.yaml")
    dense = [t for t in expand(spec, source) if t.variant == "dense"]
    ladder_table(spec, dense)
    fits_table(spec, dense, nodes=1)
    fits_table(spec, dense, nodes=Placement.of(spec).nodes)


if __name__ == "__main__":
    main()
