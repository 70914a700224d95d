"""`results fit` and `results forecast` on imported ladders of 250, 10,000 and 100,000 rows
(a cost that grows gently with the rows; goal: < 60 CPU s and < 1 GB peak RSS at 100,000
rows). Run: python benchmarks/results_scale.py [--rows 250 --rows 10000 ...]

The ladder: 250 runs (10 compute budgets from 1e18 to 1e21 FLOPs x 25 sizes, D = C / 6N),
each imported as `rows / 250` curve points (its N, the tokens D seen at that step and the
loss there): the table a user gets by importing every point of every curve. Losses follow
Chinchilla's law (E 1.69, A 406.4, B 410.7, alpha 0.34, beta 0.28) times 1% log-normal
noise. Each size: a CSV is written, `scalelab results import` reads it into a sweep, then
`results fit` and `results forecast --holdout-above-flops` (the points above 0.9x the
largest budget held out) run, each in its own subprocess. CPU s is the child's user + sys
and peak MB its maximum resident set (os.wait4), so the table compares the three sizes
measured side by side in one run. `--scalelab LABEL=DIR` (repeatable) runs the commands
from another tree's code (DIR holding a `scalelab` package, put first on PYTHONPATH),
e.g. the commit before a change next to the one after it:

    git archive COMMIT | tar -x -C /tmp/before/pkg && ln -s pkg /tmp/before/scalelab
    python benchmarks/results_scale.py --scalelab before=/tmp/before --scalelab after=/tmp/after
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

RUNS = 250
BUDGETS = np.geomspace(1e18, 1e21, 10)
LAW = {"E": 1.69, "A": 406.4, "B": 410.7, "alpha": 0.34, "beta": 0.28}
HOLDOUT = 0.9 * float(BUDGETS[-1])  # forecast the last tenth of the largest budget's runs
GOAL_CPU_S, GOAL_MB = 60.0, 1024.0


@dataclass(frozen=True)
class Measured:
    wall_s: float
    cpu_s: float  # the child's user + sys
    peak_mb: float  # the child's maximum resident set
    rc: int
    tail: str  # the end of its output, for a failure


def write_ladder(path: Path, rows: int, seed: int = 0) -> int:
    """`rows` curve points of RUNS runs (module doc) as a CSV of n_params, tokens, loss;
    the number of rows written."""
    rng = np.random.default_rng(seed)
    per_run = max(rows // RUNS, 1)
    budget = np.repeat(BUDGETS, RUNS // BUDGETS.size)
    # 25 sizes per budget, spread around its compute-optimal N (~20 tokens per parameter)
    n_opt = np.sqrt(budget / (6 * 20))
    n = np.round(n_opt * np.tile(np.geomspace(0.2, 5.0, RUNS // BUDGETS.size), BUDGETS.size))
    d_final = budget / (6 * n)
    frac = np.arange(1, per_run + 1) / per_run  # the steps: an equal share of D each
    big_n = np.repeat(n, per_run)
    d = np.round(np.outer(d_final, frac).ravel())
    loss = LAW["E"] + LAW["A"] / big_n ** LAW["alpha"] + LAW["B"] / d ** LAW["beta"]
    loss *= np.exp(rng.normal(0.0, 0.01, loss.size))
    with open(path, "w") as f:
        f.write("n_params,tokens,loss\n")
        np.savetxt(f, np.column_stack([big_n, d, loss]), fmt=["%d", "%d", "%.6f"], delimiter=",")
    return int(loss.size)


def run(args: list[str], env: dict[str, str], timeout_s: float, max_gb: float) -> Measured:
    """`python -m scalelab ARGS` in a child process under `timeout` (killed past it: rc
    137) and an address-space cap of `max_gb` (numpy then raises MemoryError: a shared
    machine is not driven into swap), its CPU and peak memory (os.wait4: that child's
    own rusage, which covers the python it execs, not the maximum over every child)."""

    def cap() -> None:
        limit = int(max_gb * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    t0 = time.perf_counter()
    cmd = ["timeout", "-s", "KILL", f"{timeout_s:g}", sys.executable, "-m", "scalelab", *args]
    with tempfile.TemporaryFile() as out:
        child = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                 preexec_fn=cap)  # fmt: skip
        _, status, usage = os.wait4(child.pid, 0)
        child.returncode = rc = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - t0
        out.seek(0)
        tail = out.read().decode(errors="replace")[-600:]
    # ru_maxrss is KiB on Linux
    return Measured(wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, rc, tail)


def environment(home: Path, scalelab: str | None) -> dict[str, str]:
    env = dict(os.environ, SCALELAB_HOME=str(home), MLFLOW_TRACKING_URI=f"sqlite:///{home}/m.db")
    env.setdefault("OMP_NUM_THREADS", "2")
    if scalelab:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (scalelab, env.get("PYTHONPATH")) if p)
    return env


def verdict(name: str, runs: list[Measured]) -> str:
    failed = [m for m in runs if m.rc != 0]
    if failed:
        why = "killed at the time limit" if failed[0].rc in (124, 137, -9) else "failed"
        if "MemoryError" in failed[0].tail or "Unable to allocate" in failed[0].tail:
            why = "out of memory (the cap)"
        return f"{why} (rc {failed[0].rc})"
    if name == "import":
        return "-"
    ok = all(m.cpu_s < GOAL_CPU_S and m.peak_mb < GOAL_MB for m in runs)
    return "yes" if ok else "NO"


def bench(sizes: list[int], codes: dict[str, str | None], options: argparse.Namespace) -> None:
    print(f"\n## results fit / forecast on imported ladders ({RUNS} runs, rows = curve points)")
    where = ", ".join(f"{k} = {v or 'this checkout'}" for k, v in codes.items())
    print(f"code: {where}; "
          f"fit --resamples {options.resamples}; forecast --holdout-above-flops {HOLDOUT:.3g}; "
          f"median of {options.repeats}; cap {options.max_gb:g} GB address space, "
          f"{options.timeout:g} s per command")  # fmt: skip
    print("| rows | code | command | wall s | CPU s | peak MB | goal (< 60 CPU s, < 1 GB) |")
    print("|---|---|---|---|---|---|---|")
    for rows in sizes:
        with tempfile.TemporaryDirectory(prefix="scalelab-bench-scale-") as tmp:
            csv = Path(tmp) / f"ladder_{rows}.csv"
            n = write_ladder(csv, rows)
            for label, scalelab in codes.items():
                home = Path(tmp) / label
                home.mkdir()
                _measure(n, label, csv, environment(home, scalelab), options)


def _measure(
    n: int, label: str, csv: Path, env: dict[str, str], options: argparse.Namespace
) -> None:
    sweep = f"scale{n}"
    commands = {
        "import": ["results", "import", str(csv), "--sweep", sweep],
        "fit": ["results", "fit", sweep, "--resamples", str(options.resamples)],
        "forecast": ["results", "forecast", sweep, "--holdout-above-flops", f"{HOLDOUT:.6g}"],
    }
    for name, args in commands.items():
        runs = []
        for _ in range(1 if name == "import" else options.repeats):
            runs.append(run(args, env, options.timeout, options.max_gb))
            if runs[-1].rc != 0:
                break
        wall, cpu, mb = (float(np.median([getattr(m, k) for m in runs]))
                         for k in ("wall_s", "cpu_s", "peak_mb"))  # fmt: skip
        print(f"| {n:,} | {label} | {name} | {wall:.1f} | {cpu:.1f} | {mb:.0f} | "
              f"{verdict(name, runs)} |", flush=True)  # fmt: skip
        if runs[-1].rc != 0:
            print("    " + runs[-1].tail.strip().replace("\n", "\n    "), file=sys.stderr)
            if name == "import":
                return


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, action="append", help="default: 250, 10000, 100000")
    parser.add_argument("--scalelab", action="append", metavar="LABEL=DIR",
                        help="run the commands from the `scalelab` package under DIR, "
                        "labelled LABEL (repeat to compare; default: this checkout)")  # fmt: skip
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per command")
    parser.add_argument("--max-gb", type=float, default=8.0, help="address-space cap per command")
    parser.add_argument("--repeats", type=int, default=1, help="runs of fit and forecast")
    parser.add_argument("--resamples", type=int, default=1000, help="`results fit --resamples`")
    args = parser.parse_args()
    codes: dict[str, str | None] = {"now": None}
    if args.scalelab:
        codes = dict(item.split("=", 1) if "=" in item else (item, item) for item in args.scalelab)
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs visible, "
        f"Python {platform.python_version()}, numpy {np.__version__}"
    )
    bench(args.rows or [250, 10_000, 100_000], codes, args)


if __name__ == "__main__":
    main()
