"""Orchestrator speed: plan a big sweep, schedule no-op trials on Ray, re-submit a finished one.

    python benchmarks/orchestration.py [--trials 10000] [--sched 1000] [--ledger 1000]

Prints one table: measured median, goal, ratio (measured / goal; < 1 meets the goal).
Uses a throw-away SCALELAB_HOME (MLflow sqlite) and an embedded Ray.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("OMP_NUM_THREADS", "1")


def _yaml(name: str, n: int, lrs: int | None = None) -> str:
    """A sweep of exactly n trials: 4 sizes x 5 variants x seeds x learning rates."""
    per = 4 * 5
    seeds = 10 if n >= per * 10 else max(1, n // per)
    lrs = lrs or max(1, n // (per * seeds))
    lr_list = ", ".join(f"{(i + 1) * 1e-5:.6g}" for i in range(lrs))
    return f"""
name: {name}
base:
  model: {{size: nano, vocab_size: 256, block_size: 64}}
  data: {{seq_len: 64}}
  train: {{tokens: 4096}}
variants: [dense, hadamard, budget, tsa, hadamard+tsa]
grid:
  model.size: [nano, micro, mini, 124M]
  seed: [{", ".join(map(str, range(seeds)))}]
  train.lr: [{lr_list}]
backend: {{concurrency: 64, cpus_per_trial: 0.01, max_retries: 0}}
"""


def _simple_yaml(name: str, n: int) -> str:
    return f"""
name: {name}
base:
  model: {{size: nano, vocab_size: 256, block_size: 64}}
  data: {{seq_len: 64}}
  train: {{tokens: 4096}}
grid:
  seed: [{", ".join(map(str, range(n)))}]
backend: {{concurrency: 64, cpus_per_trial: 0.01, max_retries: 0}}
"""


def bench_plan(n: int, repeats: int = 3) -> float:
    from scalelab.orchestrator.expand import expand, plan_rows
    from scalelab.orchestrator.spec import parse_spec

    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        spec, source = parse_spec(_yaml("plan", n))
        trials = expand(spec, source, max_trials=n)
        plan_rows(spec, trials)
        times.append(time.perf_counter() - t0)
    assert len(trials) == n, len(trials)
    return statistics.median(times)


def bench_schedule(n: int) -> tuple[float, float]:
    """(seconds per trial for the whole driver loop, of which MLflow sync) with no-op jobs."""
    from scalelab.orchestrator.backends.base import ray_init
    from scalelab.orchestrator.expand import expand
    from scalelab.orchestrator.ledger import Ledger
    from scalelab.orchestrator.scheduler import run_sweep
    from scalelab.orchestrator.spec import parse_spec

    ray_init("local", embedded=True, workers=64)  # the sweep's concurrency, as LocalBackend does
    spec, source = parse_spec(_simple_yaml("sched", n))
    trials = expand(spec, source, max_trials=n)
    ledger = Ledger(spec.name)
    t0 = time.perf_counter()
    ledger.sync(spec, trials)
    t_sync = time.perf_counter() - t0
    t0 = time.perf_counter()
    out = run_sweep(spec, trials, Ledger(spec.name), job="benchmarks.orchestration:noop")
    t_run = time.perf_counter() - t0
    assert len(out.finished) == n, out
    return t_run / n, t_sync / n


def bench_ray_alone(n: int, window: int = 64) -> float:
    """Seconds per task for Ray itself running `n` empty tasks of the trials' shape (0.01
    CPU), at most `window` in flight: the floor under the driver loop's per-trial cost."""
    import ray

    from scalelab.orchestrator.backends.base import ray_init

    ray_init("local", embedded=True, workers=64)  # the sweep's concurrency, as LocalBackend does
    task = ray.remote(noop).options(num_cpus=0.01, max_retries=0, name="empty-task")
    ray.get(task.remote(None))  # a worker up, as the sweep's first trial has one
    t0 = time.perf_counter()
    inflight, started = [], 0
    while started < n or inflight:
        while started < n and len(inflight) < window:
            inflight.append(task.remote(None))
            started += 1
        done, inflight = ray.wait(inflight, num_returns=1)
        ray.get(done)
    return (time.perf_counter() - t0) / n


def bench_resubmit(n: int) -> tuple[float, int]:
    """(seconds to re-submit an all-FINISHED sweep, runs created by it)."""
    from scalelab.orchestrator.expand import expand
    from scalelab.orchestrator.ledger import Ledger
    from scalelab.orchestrator.scheduler import run_sweep
    from scalelab.orchestrator.spec import parse_spec

    spec, source = parse_spec(_simple_yaml("sched", n))  # finished by bench_schedule
    trials = expand(spec, source, max_trials=n)
    ledger = Ledger(spec.name)
    before = len(ledger.records())
    t0 = time.perf_counter()
    out = run_sweep(spec, trials, Ledger(spec.name), job="benchmarks.orchestration:noop")
    elapsed = time.perf_counter() - t0
    assert len(out.skipped) == n
    return elapsed, len(ledger.records()) - before


def noop(job: object, run_id: str | None = None) -> dict:
    return {"status": "FINISHED"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trials", type=int, default=10_000)
    parser.add_argument("--sched", type=int, default=1_000)
    args = parser.parse_args()
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    home = tempfile.mkdtemp(prefix="scalelab-bench-")
    os.environ["SCALELAB_HOME"] = home
    os.environ.pop("MLFLOW_TRACKING_URI", None)

    rows = []
    t = bench_plan(args.trials)
    rows.append((f"validate+expand+plan {args.trials:,} trials", f"{t:.2f} s", "2 s", t / 2))
    per, sync = bench_schedule(args.sched)
    rows.append(
        (
            f"schedule {args.sched:,} no-op trials (driver loop)",
            f"{per * 1e3:.1f} ms/trial",
            "50 ms/trial",
            per / 0.05,
        )
    )
    rows.append(
        (
            f"  create {args.sched:,} SCHEDULED runs (in sync)",
            f"{sync * 1e3:.1f} ms/trial",
            "-",
            float("nan"),
        )
    )
    alone = bench_ray_alone(args.sched)
    rows.append(
        (
            f"  Ray alone: {args.sched:,} empty tasks, 64 in flight",
            f"{alone * 1e3:.1f} ms/task",
            "-",
            float("nan"),
        )
    )
    t, created = bench_resubmit(args.sched)
    rows.append(
        (
            f"re-submit {args.sched:,} FINISHED trials",
            f"{t:.2f} s, {created} runs created",
            "5 s, 0 runs",
            t / 5,
        )
    )

    width = max(len(r[0]) for r in rows)
    print(f"{'benchmark':<{width}}  {'measured (median)':>28}  {'goal':>12}  {'ratio':>6}")
    for name, measured, goal, ratio in rows:
        print(f"{name:<{width}}  {measured:>28}  {goal:>12}  {ratio:>6.2f}")


if __name__ == "__main__":
    main()
