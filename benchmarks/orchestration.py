"""Orchestrator speed: plan a big sweep, schedule no-op trials on Ray, re-submit a finished one.

    python benchmarks/orchestration.py [--trials 10000] [--sched 1000] [--repeats 2]

Prints one table: measured median, goal, ratio (measured / goal; < 1 meets the goal).
Uses a throw-away SCALELAB_HOME (MLflow sqlite). The scheduling rows put the driver loop
side by side with Ray alone running as many empty tasks, each in its own process on a fresh
embedded cluster (nothing warm), `--repeats` pairs, with the CPU each side spent.
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
    from scalelab.orchestrator.plan.expand import expand, plan_rows
    from scalelab.orchestrator.plan.spec import parse_spec

    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        spec, source = parse_spec(_yaml("plan", n))
        trials = expand(spec, source, max_trials=n)
        plan_rows(spec, trials)
        times.append(time.perf_counter() - t0)
    assert len(trials) == n, len(trials)
    return statistics.median(times)


def _cluster_cpu_s() -> float:
    """CPU seconds of every process this one started (the embedded cluster: GCS, raylet,
    workers), read before it ends."""
    import psutil

    total = 0.0
    for child in psutil.Process().children(recursive=True):
        try:
            t = child.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def _workers() -> int:
    import psutil

    return sum(1 for c in psutil.Process().children(recursive=True) if c.name().startswith("ray::"))


def _dead_workers() -> int:
    """The cluster's workers that are gone before it ends: with the sweep's concurrency as
    Ray's idle-worker limit none should end (a worker's logs, worker-<id>-<job>-<pid>.out,
    outlive it; Ray moves those of an ended one into logs/old/)."""
    from pathlib import Path

    import psutil
    import ray

    logs = Path(ray._private.worker._global_node.get_session_dir_path()) / "logs"
    outs = [*logs.glob("worker-*.out"), *logs.glob("old/worker-*.out")]
    return sum(1 for p in outs if not psutil.pid_exists(int(p.stem.rsplit("-", 1)[1])))


def _start() -> tuple[float, float, float]:
    """Wall, driver CPU and cluster CPU (its start-up excluded) at the start of a part."""
    return time.perf_counter(), time.process_time(), _cluster_cpu_s()


def _costs(n: int, start: tuple[float, float, float]) -> dict[str, float]:
    t0, c0, k0 = start
    return {
        "wall_ms": (time.perf_counter() - t0) / n * 1e3,
        "driver_cpu_ms": (time.process_time() - c0) / n * 1e3,
        "cluster_cpu_ms": (_cluster_cpu_s() - k0) / n * 1e3,
        "workers": _workers(),
        "dead_workers": _dead_workers(),
    }


def part_sweep(n: int) -> dict[str, float]:
    """The driver loop over n no-op trials on a fresh embedded cluster, as `submit` runs
    it (their placeholders made first, by `sync`, timed apart)."""
    from scalelab.orchestrator.backends.base import ray_init
    from scalelab.orchestrator.ledger import Ledger
    from scalelab.orchestrator.plan.expand import expand
    from scalelab.orchestrator.plan.spec import parse_spec
    from scalelab.orchestrator.scheduler import run_sweep

    spec, source = parse_spec(_simple_yaml("sched", n))
    trials = expand(spec, source, max_trials=n)
    t0 = time.perf_counter()
    Ledger(spec.name).sync(spec, trials)
    sync_ms = (time.perf_counter() - t0) / n * 1e3
    ray_init("local", embedded=True, workers=64)  # the sweep's concurrency, as LocalBackend does
    start = _start()
    out = run_sweep(spec, trials, Ledger(spec.name), job="benchmarks.orchestration:noop")
    assert len(out.finished) == n, out
    return _costs(n, start) | {"sync_ms": sync_ms}


def part_ray_alone(n: int, window: int = 64) -> dict[str, float]:
    """Ray itself running n empty tasks of the trials' shape (0.01 CPU), at most `window`
    in flight, on a fresh embedded cluster started as the sweep's is: the floor under the
    driver loop's per-trial cost, worker starts included."""
    from scalelab.orchestrator.backends.base import ray_init

    ray_init("local", embedded=True, workers=64)  # first: it imports Ray in single-node mode
    import ray

    task = ray.remote(noop).options(num_cpus=0.01, max_retries=0, name="empty-task")
    start = _start()
    inflight, started = [], 0
    while started < n or inflight:
        while started < n and len(inflight) < window:
            inflight.append(task.remote(None))
            started += 1
        done, inflight = ray.wait(inflight, num_returns=1)
        ray.get(done)
    return _costs(n, start)


def _in_fresh_process(part: str, n: int, home: str) -> dict[str, float]:
    """Run one part in its own interpreter (its own embedded cluster, nothing warm)."""
    import json
    import subprocess

    env = {**os.environ, "SCALELAB_HOME": home}
    out = subprocess.run(
        [sys.executable, __file__, "--part", part, "--sched", str(n)],
        env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    # the part's line is its last JSON one: Ray prints its workers' output to stdout too
    return json.loads([line for line in out.stdout.splitlines() if line.startswith("{")][-1])


def bench_resubmit(n: int) -> tuple[float, int]:
    """(seconds to re-submit an all-FINISHED sweep, runs created by it)."""
    from scalelab.orchestrator.ledger import Ledger
    from scalelab.orchestrator.plan.expand import expand
    from scalelab.orchestrator.plan.spec import parse_spec
    from scalelab.orchestrator.scheduler import run_sweep

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
    parser.add_argument("--repeats", type=int, default=1, help="side-by-side pairs")
    parser.add_argument("--part", choices=["sweep", "ray"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if args.part:  # one measurement, in this fresh process
        import json

        os.environ.pop("MLFLOW_TRACKING_URI", None)
        fn = part_sweep if args.part == "sweep" else part_ray_alone
        print(json.dumps(fn(args.sched)))
        return
    home = tempfile.mkdtemp(prefix="scalelab-bench-")
    os.environ["SCALELAB_HOME"] = home
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    print(f"load average at the start: {os.getloadavg()[0]:.2f}", flush=True)

    rows = []
    t = bench_plan(args.trials)
    rows.append((f"validate+expand+plan {args.trials:,} trials", f"{t:.2f} s", "2 s", t / 2))
    sweeps, alone = [], []
    for _ in range(args.repeats):  # side by side: Ray alone, then the sweep, each fresh
        alone.append(_in_fresh_process("ray", args.sched, home))
        sweeps.append(_in_fresh_process("sweep", args.sched, tempfile.mkdtemp(dir=home)))
    med = {k: statistics.median(r[k] for r in sweeps) for k in sweeps[0]}
    ray_med = {k: statistics.median(r[k] for r in alone) for k in alone[0]}
    n = f"{args.sched:,}"
    rows += [
        (f"schedule {n} no-op trials (driver loop), wall", f"{med['wall_ms']:.1f} ms/trial",
         "50 ms/trial", med["wall_ms"] / 50),
        ("  driver CPU", f"{med['driver_cpu_ms']:.1f} ms/trial", "-", float("nan")),
        ("  cluster CPU after its start (raylet, GCS, workers)", f"{med['cluster_cpu_ms']:.1f} ms/trial", "-",
         float("nan")),
        ("  worker processes at the end", f"{med['workers']:.0f}", "-", float("nan")),
        ("  worker processes that died (all runs)", f"{sum(r['dead_workers'] for r in sweeps):.0f}",
         "0", float("nan")),
        (f"  create {n} SCHEDULED runs (in sync)", f"{med['sync_ms']:.1f} ms/trial", "-",
         float("nan")),
        (f"Ray alone: {n} empty tasks, 64 in flight, wall", f"{ray_med['wall_ms']:.1f} ms/task",
         "-", float("nan")),
        ("  driver CPU", f"{ray_med['driver_cpu_ms']:.1f} ms/task", "-", float("nan")),
        ("  cluster CPU after its start (raylet, GCS, workers)", f"{ray_med['cluster_cpu_ms']:.1f} ms/task",
         "-", float("nan")),
        ("  worker processes at the end", f"{ray_med['workers']:.0f}", "-", float("nan")),
        ("sweep / Ray alone, wall", f"{med['wall_ms'] / ray_med['wall_ms']:.2f}x", "-",
         float("nan")),
    ]  # fmt: skip
    os.environ["SCALELAB_HOME"] = _last_home(home)
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
    print(f"load average at the end: {os.getloadavg()[0]:.2f}; runs of each: {args.repeats}")


def _last_home(home: str) -> str:
    """The work folder of the last sweep measured (its trials are all FINISHED)."""
    folders = [os.path.join(home, d) for d in os.listdir(home)]
    folders = [f for f in folders if os.path.isdir(f)]
    return max(folders, key=os.path.getmtime)


if __name__ == "__main__":
    main()
