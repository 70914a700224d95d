"""Benchmarks for issue 8 (results and scaling). Run: python benchmarks/results.py [--only NAME]

Each section is one function printing a table; add sections to SECTIONS.

bootstrap: a full bootstrap fit with 1,000 resamples over 100 trials (goal: < 10 s on 2
cores) for the Chinchilla law (Approach 3), the loss-versus-compute law and the
compute-equivalent gain (100 trials: 50 baseline + 50 variant).

sync: `analysis.results.sync` of 1,000 trials x 1,000 curve points from local curve
files (goal: < 30 s), cold and incremental (all FINISHED: nothing re-read). The synthetic
sweep (real MLflow sqlite runs + trial directories) is written once to
$SCALELAB_BENCH_DIR (default /tmp/scalelab-bench-results) and reused.

forecast: issue 28's one L(N, D) law on 250 points: fit, bootstrap, checks and the
calibrated forecast.

query: group-by over 10M curve rows (goal: < 1 s) with pyarrow compute, on a Parquet
partition written by the results store (1,000 trials x 10 metrics x 1,000 steps).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from scalelab.analysis.scaling import (
    ChinchillaFit,
    Trials,
    bootstrap,
    compute_equivalent_gain,
    fit_chinchilla,
    fit_power_law,
)

GOAL_S = 10.0


def _timed(fn: Callable[[], object]) -> tuple[float, float]:
    """(wall s, CPU s of this process): on a shared machine the gap is other load."""
    t0, c0 = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - t0, time.process_time() - c0


def bench_bootstrap(n_resamples: int = 1000, repeats: int = 3) -> None:
    rng = np.random.default_rng(0)
    law = ChinchillaFit(E=1.69, A=406.4, B=410.7, alpha=0.34, beta=0.28, n_trials=0)
    n, ratio = np.meshgrid(np.geomspace(5e7, 1e10, 10), np.geomspace(4, 160, 10))
    n, d = n.ravel(), (n * ratio).ravel()  # 100 trials
    loss = law.predict(n, d) * np.exp(rng.normal(0, 0.005, n.size))
    flops = np.geomspace(1e15, 1e19, 100)
    c_loss = (1.8 + 300 * flops**-0.15) * np.exp(rng.normal(0, 0.003, 100))
    half = np.geomspace(1e15, 1e19, 50)
    base = Trials("dense", half, (1.8 + 300 * half**-0.15) * np.exp(rng.normal(0, 0.003, 50)))
    var = Trials(
        "hadamard", half, (1.8 + 300 * (half / 0.8) ** -0.15) * np.exp(rng.normal(0, 0.003, 50))
    )
    cases = {
        "chinchilla L(N,D)": (
            lambda: fit_chinchilla(n, d, loss),
            lambda: bootstrap(fit_chinchilla, n, d, loss, n_resamples=n_resamples),
        ),
        "power law L(C)": (
            lambda: fit_power_law(flops, c_loss),
            lambda: bootstrap(fit_power_law, flops, c_loss, n_resamples=n_resamples),
        ),
        "gain (shifted law)": (
            lambda: compute_equivalent_gain(var, base, n_resamples=1),
            lambda: compute_equivalent_gain(var, base, n_resamples=n_resamples),
        ),
    }
    print(f"\n## bootstrap: {n_resamples} resamples over 100 trials (median of {repeats})")
    head = (
        f"| {'fit':<18} | point fit s | bootstrap s | bootstrap CPU s | ms/resample "
        "| goal s | within goal |"
    )
    print(head)
    print("|" + "|".join("-" * (len(c)) for c in head.split("|")[1:-1]) + "|")
    for name, (point, boot) in cases.items():
        t_point = np.median([_timed(point)[0] for _ in range(repeats)])
        t_boot, cpu_boot = np.median([_timed(boot) for _ in range(repeats)], axis=0)
        print(
            f"| {name:<18} | {t_point:11.2f} | {t_boot:11.2f} | {cpu_boot:15.2f} | "
            f"{1000 * t_boot / n_resamples:11.2f} | {GOAL_S:6.0f} | "
            f"{'yes' if t_boot < GOAL_S else 'NO':>11} |"
        )


def _env_home() -> str:
    return os.environ.get("SCALELAB_BENCH_DIR", "/tmp/scalelab-bench-results")


def bench_sync(n_seeds: int = 25, steps: int = 250) -> None:
    """1,000 trials (2 variants x 4 sizes x 5 budgets x 25 seeds) x 1,000 points
    (250 steps x 4 metrics)."""
    import shutil

    home = _env_home()
    os.environ["SCALELAB_HOME"] = home
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    from scalelab.analysis.results import sync, tables

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "orchestrator"))
    from synthetic_sweep import write_sweep  # test support: writes sweeps straight into MLflow

    marker = os.path.join(home, "bench-sweep-ready")
    if not os.path.exists(marker):
        shutil.rmtree(home, ignore_errors=True)
        t0 = time.perf_counter()
        write_sweep(
            "bench", sizes=("nano", "micro", "mini", "124M"), tokens_per_param=(5, 10, 20, 40, 80),
            seeds=tuple(range(n_seeds)), steps=steps,
        )  # fmt: skip
        open(marker, "w").close()
        print(
            f"\n(setup: wrote 1,000 MLflow runs + trial dirs in {time.perf_counter() - t0:.0f} s)"
        )
    shutil.rmtree(tables.table_dir(tables.TRIALS), ignore_errors=True)
    shutil.rmtree(tables.table_dir(tables.CURVES), ignore_errors=True)
    shutil.rmtree(tables.sweep_dir("bench"), ignore_errors=True)
    cold_wall, cold_cpu = _timed(lambda: sync("bench"))
    result = sync("bench")
    warm = [_timed(lambda: sync("bench")) for _ in range(3)]
    warm_wall, warm_cpu = np.median(warm, axis=0)
    print(
        f"\n## sync: {result.n_trials:,} trials x {result.n_curve_rows // max(result.n_trials, 1):,} points"
    )
    head = "| case | wall s | CPU s | curve rows | goal s | within goal |"
    print(head)
    print("|---|---|---|---|---|---|")
    print(
        f"| cold (all trials read) | {cold_wall:.1f} | {cold_cpu:.1f} | {result.n_curve_rows:,} | 30 | {'yes' if cold_wall < 30 else 'NO'} |"
    )
    print(
        f"| incremental (all FINISHED, none read), median of 3 | {warm_wall:.1f} | {warm_cpu:.1f} | {result.n_curve_rows:,} | - | - |"
    )


def bench_query(
    n_trials: int = 1000, n_metrics: int = 10, steps: int = 1000, repeats: int = 3
) -> None:
    import tempfile

    import pyarrow as pa
    import pyarrow.parquet as pq

    from scalelab.analysis.results import metric_at, query, tables

    root = tempfile.mkdtemp(prefix="scalelab-bench-query-")
    n = n_trials * n_metrics * steps
    ids = np.array([f"{i:016x}" for i in range(n_trials)])
    metrics = np.array(["val/loss"] + [f"m{j}" for j in range(1, n_metrics)])
    tid = pa.DictionaryArray.from_arrays(
        pa.array(np.repeat(np.arange(n_trials, dtype=np.int32), n_metrics * steps)), pa.array(ids)
    )
    met = pa.DictionaryArray.from_arrays(
        pa.array(np.tile(np.repeat(np.arange(n_metrics, dtype=np.int32), steps), n_trials)),
        pa.array(metrics),
    )
    step = np.tile(np.arange(1, steps + 1), n_trials * n_metrics)
    flops = step * 1e12 * np.repeat(np.geomspace(1, 1e4, n_trials), n_metrics * steps)
    curves = pa.table({"trial_id": tid, "step": step, "tokens": step * 1000, "flops": flops,
                       "metric": met, "value": np.random.default_rng(0).random(n)})  # fmt: skip
    trials = pa.table({"trial_id": ids, "variant": np.array(["dense", "hadamard"])[np.arange(n_trials) % 2],
                       "size": np.array(["nano", "micro", "mini", "124M"])[np.arange(n_trials) % 4],
                       "status": ["FINISHED"] * n_trials})  # fmt: skip
    t0 = time.perf_counter()
    part = tables.write_table(tables.CURVES, "big", curves.cast(tables.curves_schema()), root)
    write_s = time.perf_counter() - t0
    tables.write_table(tables.TRIALS, "big", trials, root)
    meta = pq.ParquetFile(next(part.glob("*.parquet"))).metadata
    size_mb = sum(f.stat().st_size for f in part.glob("*.parquet")) / 2**20
    loaded = tables.read_table(tables.CURVES, "big", root)
    cases = {
        "read the curves partition": lambda: tables.read_table(tables.CURVES, "big", root),
        "group by metric (in memory)": lambda: loaded.group_by("metric").aggregate(
            [("value", "mean"), ("value", "max")]
        ),
        "group by trial_id, metric (in memory)": lambda: loaded.group_by(
            ["trial_id", "metric"]
        ).aggregate([("value", "mean")]),
        "query(table=curves, group_by=metric) incl. read": lambda: query(
            "big", table="curves", group_by=["metric"], root=root
        ),
        "query(curves, group_by=variant,metric) incl. read + join": lambda: query(
            "big", table="curves", group_by=["variant", "metric"], root=root
        ),
        "metric_at(val/loss, flops=1e15), 1,000 trials": lambda: metric_at(
            loaded, "val/loss", "flops=1e15"
        ),
    }
    print(
        f"\n## query: {n:,} curve rows ({meta.num_row_groups} row groups, {size_mb:.0f} MiB zstd, written in {write_s:.1f} s); median of {repeats}"
    )
    print("| operation | wall s | CPU s | goal s | within goal |")
    print("|---|---|---|---|---|")
    for name, fn in cases.items():
        wall, cpu = np.median([_timed(fn) for _ in range(repeats)], axis=0)
        goal = 1.0 if name.startswith(("group by", "query")) else None
        ok = "-" if goal is None else ("yes" if wall < goal else "NO")
        print(f"| {name} | {wall:.2f} | {cpu:.2f} | {goal or '-'} | {ok} |")


def bench_forecast(n_resamples: int = 200, repeats: int = 3) -> None:
    """Issue 28: the one L(N, D) law on 250 points (10 sizes x 25 tokens per parameter,
    0.5% noise): the grid-searched Huber fit, its bootstrap, the checks (standardised
    residuals, 250 leave-one-out refits for influence) and the calibrated forecast (the
    fit, its delta-method covariance, leave-one-size-out misfit, checks)."""
    from scalelab.analysis.scaling.checks import check_chinchilla
    from scalelab.analysis.scaling.loss_interval import fit_forecast_law
    from scalelab.analysis.scaling.robust import robust_law

    rng = np.random.default_rng(0)
    law = ChinchillaFit(E=1.69, A=406.4, B=410.7, alpha=0.34, beta=0.28, n_trials=0)
    n, ratio = np.meshgrid(np.geomspace(5e7, 1e10, 10), np.geomspace(4, 160, 25))
    n, d = n.ravel(), (n * ratio).ravel()
    loss = law.predict(n, d) * np.exp(rng.normal(0, 0.005, n.size))
    point = fit_chinchilla(n, d, loss)
    robust = robust_law(n, d, loss, fit=point)
    cases: dict[str, Callable[[], object]] = {
        "fit_chinchilla (grid + L-BFGS-B)": lambda: fit_chinchilla(n, d, loss),
        f"bootstrap, {n_resamples} resamples": lambda: bootstrap(
            fit_chinchilla, n, d, loss, n_resamples=n_resamples
        ),
        "covariance + leave-one-size-out misfit": lambda: robust_law(n, d, loss, fit=point),
        "checks (incl. 250 leave-one-out refits)": lambda: check_chinchilla(robust, n, d, loss),
        "forecast law (fit + all of the above but the bootstrap)": lambda: fit_forecast_law(
            n, d, 6 * n * d, loss, law="ND"
        ),
    }
    print(f"\n## forecast: L(N, D) on {n.size} points (median of {repeats})")
    print("| operation | wall s | CPU s |")
    print("|---|---|---|")
    for name, fn in cases.items():
        wall, cpu = np.median([_timed(fn) for _ in range(repeats)], axis=0)
        print(f"| {name} | {wall:.2f} | {cpu:.2f} |")


SECTIONS: dict[str, Callable[[], None]] = {
    "bootstrap": bench_bootstrap,
    "forecast": bench_forecast,
    "sync": bench_sync,
    "query": bench_query,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=sorted(SECTIONS), action="append")
    args = parser.parse_args()
    print(
        f"machine: {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} CPUs visible, Python {platform.python_version()}, "
        f"numpy {np.__version__}"
    )
    for name in args.only or SECTIONS:
        SECTIONS[name]()


if __name__ == "__main__":
    main()
