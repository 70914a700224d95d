"""Benchmarks for issue 8 (results and scaling). Run: python benchmarks/results.py [--only NAME]

Each section is one function printing a table; add sections to SECTIONS.

bootstrap: a full bootstrap fit with 1,000 resamples over 100 trials (goal: < 10 s on 2
cores) for the Chinchilla law (Approach 3), the loss-versus-compute law and the
compute-equivalent gain (100 trials: 50 baseline + 50 variant).
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from collections.abc import Callable

import numpy as np

from orchestrator.scaling import (
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
        "gain (shared E)": (
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


SECTIONS: dict[str, Callable[[], None]] = {"bootstrap": bench_bootstrap}


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
