"""The 124M training step on every GPU of this machine, against the planner.

training.py measures one rank. Here, on a machine with N > 1 GPUs, N ranks (started by
jobs/training/local_ranks.py, the launcher of a trial's ranks, its rendezvous on 127.0.0.1) each
build the sweep's dense 124M engine (ZeRO-1: the optimizer states sharded N ways) and
train it as training.py does, one micro-batch per rank and step. Rank 0 writes the same
three checks for the world: the largest model-state bytes and CUDA peak of any rank
against the planner's estimate for one node of N GPUs, and the MFU of all N GPUs against
the sweep's assumed MFU. With one GPU it is skipped, saying so. The CPU path runs it on
two gloo ranks (the nano case), so the multi-rank code runs in CI.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

from benchmarks.acceptance import training
from benchmarks.acceptance.checks import NO_GPU, Check

CPU_RANKS = 2
RESULT_FILE = "data-parallel.json"


def ranks_here(cpu: bool) -> int:
    import torch

    return CPU_RANKS if cpu else torch.cuda.device_count()


def run(cpu: bool, out: Path) -> list[Check]:
    """The checks of the 124M case on every GPU here (each rank a process of its own)."""
    from scalelab.jobs.training.local_ranks import run_local_ranks

    ranks = ranks_here(cpu)
    case = (training.CPU if cpu else training.GPU).cases[0]
    if ranks < 2:
        goal = "the steps above on every GPU of this machine, against the planner"
        measured = f"needs 2 or more GPUs; {ranks} CUDA device here"
        return [Check(f"{training.case_name(case)} on every GPU", goal, "skipped", measured)]
    name = training.case_name(case, ranks)
    result = out / RESULT_FILE
    result.unlink(missing_ok=True)
    command = [sys.executable, "-m", "benchmarks.acceptance.data_parallel", str(result)]
    code = run_local_ranks(command + (["--cpu"] if cpu else []), ranks)
    if code != 0 or not result.exists():
        return [Check(name, "runs to the end", "fail", f"{ranks} ranks: exit code {code}")]
    return [Check(**c) for c in json.loads(result.read_text())]


def on_this_rank(cpu: bool, result: Path) -> None:
    """One rank's part: build, train, gather every rank's measurements; rank 0 writes the
    checks to `result`."""
    import torch.distributed as dist

    from scalelab.jobs.training.accounting import device_peak_flops
    from scalelab.orchestrator.plan.planner import plan_trial
    from scalelab.orchestrator.plan.spec import load_spec

    sizes = training.CPU if cpu else training.GPU
    case = sizes.cases[0]
    spec, _ = load_spec(training.SWEEP)
    with training.process_group() as env:
        trial = training.sweep_trial(case, spec, sizes.warmup + sizes.steps + 1, env.world_size)
        plan = plan_trial(trial, spec, training.placement_here(env.device, env.world_size))
        trainer, base = training.build_trainer(trial.job, env)
        mine = training.train_steps(trainer, sizes.warmup, sizes.steps, base)
        states_est = training.states_estimate(trainer)
        every: list[training.Measured | None] = [None] * env.world_size
        dist.all_gather_object(every, mine)
    if env.rank != 0:
        return
    world = world_measurement([m for m in every if m is not None])
    job, peak = trial.job, device_peak_flops(env.device)
    achieved = training.utilisation(world, job.model, job.data.seq_len, env.world_size, peak)
    why = NO_GPU if cpu else f"no bf16 peak for {env.device} in jobs/gpus.py"
    checks = training.step_checks(case, world, plan, states_est, spec.estimate.mfu, achieved,
                                  why, ranks=env.world_size)  # fmt: skip
    result.write_text(json.dumps([asdict(c) for c in checks], indent=2))


def world_measurement(ranks: list[training.Measured]) -> training.Measured:
    """The world as one measurement: the ranks step together, so the slowest rank's tokens/s
    times the rank count, the longest forward + backward and optimizer step of any rank over
    every rank's micro-batch tokens; and the largest memory any rank holds (what must fit a
    GPU)."""
    peaks = [m.peak_bytes for m in ranks if m.peak_bytes is not None]
    return training.Measured(
        tokens_per_s=len(ranks) * min(m.tokens_per_s for m in ranks),
        states_bytes=max(m.states_bytes for m in ranks),
        peak_bytes=max(peaks) if peaks else None,
        forward_backward_s=max(m.forward_backward_s for m in ranks),
        optimizer_step_s=max(m.optimizer_step_s for m in ranks),
        micro_batch_tokens=sum(m.micro_batch_tokens for m in ranks),
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="one rank of the data-parallel check")
    parser.add_argument("result", type=Path, help="where rank 0 writes the checks (JSON)")
    parser.add_argument("--cpu", action="store_true", help="the CPU-sized case on gloo")
    args = parser.parse_args(argv)
    on_this_rank(args.cpu, args.result)


if __name__ == "__main__":
    main()
