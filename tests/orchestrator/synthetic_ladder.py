"""Synthetic ladders with a known truth, in memory (numpy, no MLflow): the statistics tests'
ground truth. (synthetic_sweep writes whole sweeps into MLflow for the tests
of sync, plots and report, and for the benchmarks.)

The baseline's loss follows L(C) = E + A C^-alpha; a variant with multiplier m follows
L(C / m) (m < 1: cheaper) at `cost` x the baseline's FLOPs per token. Each trial's log
loss is the law's plus three independent normal terms:

    cell_sd   the cell's offset from the law (its N/D allocation), shared by every variant
              and seed of the cell
    seed_sd   the seed's effect in its cell (data order), shared by the variants
    trial_sd  the trial's own noise

DEMO's constants are the demo sweep's (make demo, 2026-12-01; docs/results.md): dense's
L(C) fitted by least squares through its six trials (E 1.89, alpha 0.34, scatter of the
cells about it 6%), the seed-to-seed scatter of a trial's final loss at nano and tiny
(about 0.8% in log, from 4 seeds: hardly shared between variants), its sizes, budgets and
6.5 FLOPs per parameter and token.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pyarrow as pa

SIZES = {"nano": 120_576, "tiny": 366_432, "micro": 834_304, "mini": 4_820_992}
TOKENS = (32_768, 98_304)
FLOPS_PER_PARAM_TOKEN = 6.5


@dataclass(frozen=True)
class Truth:
    E: float
    A: float
    alpha: float
    cell_sd: float
    seed_sd: float
    trial_sd: float

    def loss(self, flops: np.ndarray, multiplier: float = 1.0) -> np.ndarray:
        return self.E + self.A * (np.asarray(flops, dtype=float) / multiplier) ** -self.alpha

    def with_noise(self, **changes: float) -> Truth:
        return replace(self, **changes)


DEMO = Truth(E=1.89, A=1.23 * 1e11**0.337, alpha=0.337, cell_sd=0.06, seed_sd=0.002,
             trial_sd=0.008)  # fmt: skip


def ladder(
    rng: np.random.Generator,
    truth: Truth = DEMO,
    *,
    multipliers: dict[str, float] | None = None,
    cost: dict[str, float] | None = None,
    sizes: dict[str, int] | None = None,
    tokens: tuple[int, ...] = TOKENS,
    seeds: tuple[int, ...] = (0,),
) -> pa.Table:
    """One sweep's trials table (variant, size, tokens, seed, n_params, flops,
    final_loss) drawn from `truth`."""
    multipliers = multipliers or {"dense": 1.0, "hadamard": 0.9}
    cost = cost or {}
    sizes = sizes or {k: SIZES[k] for k in ("nano", "tiny", "micro")}
    cols: dict[str, list] = {k: [] for k in ("variant", "size", "tokens", "seed", "n_params",
                                             "flops", "final_loss")}  # fmt: skip
    for size, n in sizes.items():
        for d in tokens:
            cell = rng.normal(0, truth.cell_sd)
            for seed in seeds:
                shared = rng.normal(0, truth.seed_sd)
                for variant, m in multipliers.items():
                    c = FLOPS_PER_PARAM_TOKEN * n * d * cost.get(variant, 1.0)
                    log_loss = np.log(truth.loss(c, m)) + cell + shared
                    loss = float(np.exp(log_loss + rng.normal(0, truth.trial_sd)))
                    for key, value in zip(cols, (variant, size, d, seed, n, c, loss), strict=True):
                        cols[key].append(value)
    return pa.table(cols)


def as_trials(table: pa.Table) -> pa.Table:
    """A ladder as the results layer's `trials` table (FINISHED, final_val_loss, ids)."""
    n = table.num_rows
    loss = table["final_loss"]
    table = table.drop_columns(["final_loss"]).append_column("final_val_loss", loss)
    table = table.append_column("status", pa.array(["FINISHED"] * n))
    return table.append_column("trial_id", pa.array([f"t{i}" for i in range(n)]))


# --- Chinchilla ladders: L(N, D), optionally only approximately ---------------------------


@dataclass(frozen=True)
class ChinchillaTruth:
    """L(N, D) = E + A/N^alpha + B/D^beta (Hoffmann et al.'s fitted constants by default),
    each run's log loss off it by N(0, noise_sd), and two ways real ladders depart from it:
    `drift` (the log loss rises smoothly by up to `drift` at the largest size, as the
    square of log N: large models a little above the law) and `n_off` off-law runs at the two smallest
    tokens per parameter, `off` above the law in log (undertrained runs)."""

    E: float = 1.69
    A: float = 406.4
    B: float = 410.7
    alpha: float = 0.34
    beta: float = 0.28
    noise_sd: float = 0.004
    drift: float = 0.0
    n_off: int = 0
    off: float = 0.08

    def loss(self, n: np.ndarray, d: np.ndarray) -> np.ndarray:
        return (
            self.E
            + self.A * np.asarray(n, float) ** -self.alpha
            + self.B * np.asarray(d, float) ** -self.beta
        )


EXACT = ChinchillaTruth()
APPROXIMATE = ChinchillaTruth(drift=0.01, n_off=3)
LADDER_N = np.geomspace(4e7, 1.6e9, 6)  # six sizes, x2.1 apart
RATIOS = (5.0, 10.0, 20.0, 40.0, 80.0)  # tokens per parameter


@dataclass(frozen=True)
class NDLadder:
    n_params: np.ndarray
    tokens: np.ndarray
    loss: np.ndarray
    off_law: np.ndarray  # bool: the runs made off the law
    truth: ChinchillaTruth

    def split(self) -> tuple[np.ndarray, np.ndarray]:
        """(train, test) masks: the largest size held out."""
        test = self.n_params == self.n_params.max()
        return ~test, test


def chinchilla_ladder(
    rng: np.random.Generator,
    truth: ChinchillaTruth = EXACT,
    *,
    sizes: np.ndarray = LADDER_N,
    ratios: tuple[float, ...] = RATIOS,
) -> NDLadder:
    """Every size at every tokens per parameter, drawn from `truth` (its docstring); the
    off-law runs are drawn among the smaller sizes' runs at the two smallest ratios."""
    n, r = np.meshgrid(np.asarray(sizes, float), np.asarray(ratios, float), indexing="ij")
    n, d = n.ravel(), (n * r).ravel()
    log_loss = np.log(truth.loss(n, d)) + rng.normal(0, truth.noise_sd, n.size)
    span = np.log(n.max() / n.min())
    log_loss += truth.drift * (np.log(n / n.min()) / span) ** 2
    off = np.zeros(n.size, bool)
    if truth.n_off:
        candidates = np.flatnonzero((d / n <= sorted(ratios)[1]) & (n < n.max()))
        off[rng.choice(candidates, size=truth.n_off, replace=False)] = True
        log_loss[off] += truth.off
    return NDLadder(n, d, np.exp(log_loss), off, truth)


# --- ladders whose true curve bends: the misfit a real forecast meets ---------------------

TALL_N = np.geomspace(4e7, 4e7 * 1.6**9, 10)  # ten sizes, x1.6 apart: 40M to 2.75B


def bending_ladder(
    rng: np.random.Generator,
    truth: ChinchillaTruth = EXACT,
    *,
    bend: float = 0.0,
    e_drift: float = 0.0,
    data_limit: float = 0.0,
    sizes: np.ndarray = TALL_N,
    ratios: tuple[float, ...] = RATIOS,
) -> NDLadder:
    """Every size at every tokens per parameter, from a curve that departs from any one
    L(N, D) as a ladder climbs: the N exponent falls by `bend` from the smallest size to
    the largest (larger models gain less than the small ones promise), E grows by the
    share `e_drift` over the same span, and runs with fewer than 20 tokens per parameter
    lose `data_limit` of their loss per unit of (20 / (D/N) - 1) (a data-limited regime).
    Noise as `truth.noise_sd`."""
    n, r = np.meshgrid(np.asarray(sizes, float), np.asarray(ratios, float), indexing="ij")
    n, d = n.ravel(), (n * r).ravel()
    x = np.log(n / n.min()) / np.log(n.max() / n.min())
    loss = truth.E * (1 + e_drift * x) + truth.A * n ** -(truth.alpha - bend * x)
    loss = (loss + truth.B * d**-truth.beta) * (1 + data_limit * np.maximum(20 * n / d - 1, 0))
    log_loss = np.log(loss) + rng.normal(0, truth.noise_sd, n.size)
    return NDLadder(n, d, np.exp(log_loss), np.zeros(n.size, bool), truth)
