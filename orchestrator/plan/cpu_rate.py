"""The FLOP/s a trial's rank gets from a CPU, for the plan's wall time and CPU-hours of a
sweep without GPUs (docs/sweep-yaml.md, 'Dry-run').

Measured, not recorded: a short probe (~0.15 s) times fp32 matrix products on one thread
(a CPU trial's rank runs with OMP_NUM_THREADS=1, orchestrator/backends/base.py) and keeps
the best of a few rounds, so a busy moment lowers it less. A table could not know this
machine's CPU, its BLAS or its vector units; the probe does, each time, and a sweep that
knows better sets `estimate.peak_flops` (then nothing is measured).

Training reaches a share of that rate, CPU_MFU unless the sweep sets `estimate.mfu`
(its default, 40 %, is the GPU assumption): benchmarks/train.py against this probe, in
docs/sweep-yaml.md, 'Dry-run'.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from scalelab.orchestrator.plan.spec import SweepSpec

CPU_MFU = 0.5  # training FLOP/s over the probe's (docs/sweep-yaml.md, "Dry-run")
PROBE_N = 256  # the matrices' side: the width of the small models a CPU trains
PROBE_ROUNDS, PROBE_ROUND_S = 5, 0.03


@dataclass(frozen=True)
class CpuRate:
    flops: float  # per rank (one thread), FLOP/s
    mfu: float  # the share of it training reaches
    how: str  # where `flops` comes from, for the plan's caption

    def describe(self) -> str:
        return f"{self.mfu:.0%} of {self.flops:.3g} FLOP/s per CPU rank ({self.how})"


def cpu_rate(spec: SweepSpec) -> CpuRate | None:
    """The rate of the sweep's CPU ranks; None for a sweep on GPUs."""
    b = spec.backend
    if b.gpus_per_node:
        return None
    est = spec.estimate
    mfu = est.mfu if "mfu" in est.model_fields_set else CPU_MFU
    if est.peak_flops is not None:
        return CpuRate(est.peak_flops, mfu, "estimate.peak_flops")
    where = "the machine you submit from" + (
        "" if b.trials_run_here else ", not the cluster's nodes"
    )
    return CpuRate(probe_flops(), mfu, f"measured on {where}: fp32 matmul, 1 thread")


def probe_flops() -> float:
    """fp32 FLOP/s of one thread on PROBE_N x PROBE_N matrix products, best of the rounds."""
    import numpy as np
    from threadpoolctl import threadpool_limits

    a = np.random.default_rng(0).random((PROBE_N, PROBE_N), dtype=np.float32)
    best = 0.0
    with threadpool_limits(1):
        a @ a  # warm-up: the BLAS's first call allocates
        for _ in range(PROBE_ROUNDS):
            start, n = time.perf_counter(), 0
            while (elapsed := time.perf_counter() - start) < PROBE_ROUND_S:
                a @ a
                n += 1
            best = max(best, 2 * PROBE_N**3 * n / elapsed)
    return best
