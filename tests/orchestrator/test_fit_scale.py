"""`results fit` on tables of many rows (issue 42, item 5): every curve point of a ladder
imported as a row. What is computed differently beyond a size (docs/scaling.md, "At
scale") gives what the exact computation gives, in memory that does not grow with the
square of the rows or with the number of resamples. Memory is measured with tracemalloc
(numpy's arrays are traced); no timing is asserted (the machines are shared)."""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable
from typing import Any

import numpy as np

from scalelab.analysis.scaling import ChinchillaFit, fit_chinchilla
from scalelab.analysis.scaling.checks import check_chinchilla
from scalelab.analysis.scaling.robust import raw_theta, robust_law, stack_fit

LAW = ChinchillaFit(E=1.69, A=406.4, B=410.7, alpha=0.34, beta=0.28, n_trials=0)
MB = 2**20


def curves(runs: int, points: int, *, seed: int = 0, sd: float = 0.01) -> tuple[np.ndarray, ...]:
    """`runs` runs of 5e7-5e9 parameters at 10-40 tokens per parameter, each seen at
    `points` steps (an equal share of its tokens each): N, D and loss per curve point."""
    rng = np.random.default_rng(seed)
    n = np.geomspace(5e7, 5e9, runs)
    d_final = 20 * n * np.geomspace(0.5, 2, runs)[rng.permutation(runs)]
    big_n = np.repeat(n, points)
    d = np.round(np.outer(d_final, np.arange(1, points + 1) / points).ravel())
    return big_n, d, LAW.predict(big_n, d) * np.exp(rng.normal(0, sd, big_n.size))


def peak_mb(fn: Callable[[], Any]) -> tuple[Any, float]:
    """fn()'s result and the peak of the memory it traced, in MiB."""
    tracemalloc.start()
    try:
        return fn(), tracemalloc.get_traced_memory()[1] / MB
    finally:
        tracemalloc.stop()


def with_far_run(runs: int, points: int) -> tuple[np.ndarray, ...]:
    """A ladder of curve points (0.01% noise) and one run alone at 40x the largest N,
    0.09% below the law (inside the Huber delta): the fit leans on it, so leaving it out
    moves constants outside their (narrow) intervals."""
    n, d, y = curves(runs, points, seed=1, sd=1e-4)
    return (np.r_[n, 2e11], np.r_[d, 4e12], np.r_[y, float(LAW.predict(2e11, 4e12)) * (1 - 9e-4)])


def test_influence_beyond_the_exact_size_finds_the_point_every_refit_would():
    """601 points (over checks.EXACT_INFLUENCE): the screen and the refits it picks flag
    the same points, with the same moves, as all 601 leave-one-out refits (robust.py's
    batched refit, as the check made them before)."""
    n, d, y = with_far_run(30, 20)
    law = robust_law(n, d, y)
    intervals = law.intervals(0.95)
    check = check_chinchilla(law, n, d, y)
    mask = ~np.eye(y.size, dtype=bool)
    rep = np.broadcast_to
    every = stack_fit(rep(n, mask.shape), rep(d, mask.shape), rep(y, mask.shape),
                      rep(raw_theta(law.fit), (y.size, 5)), has_E=True, mask=mask)  # fmt: skip
    theta = every.theta.copy()
    theta[:, 1:3] += theta[:, 3:] * every.shift
    values = {"E": np.exp(theta[:, 0]), "A": np.exp(theta[:, 1]), "B": np.exp(theta[:, 2]),
              "alpha": theta[:, 3], "beta": theta[:, 4]}  # fmt: skip
    moved = {i for i in range(y.size) if any(v[i] not in intervals[k] for k, v in values.items())}
    assert moved == {y.size - 1}
    flagged = {o.index: o.moves for o in check.outliers if o.moves}
    assert set(flagged) == moved
    base = law.fit.values()
    expected = ", ".join(f"{k} {base[k]:.3g} -> {values[k][-1]:.3g}" for k in values
                         if values[k][-1] not in intervals[k])  # fmt: skip
    assert sorted(flagged[y.size - 1].split(", ")) == sorted(expected.split(", "))


def test_influence_on_1501_points_stays_in_memory_linear_in_the_points():
    """The check once refitted every leave-one-out problem at once: (n, n, 5) arrays,
    ~90 MB each at 1,501 points (and 400 GB at 100,000)."""
    n, d, y = with_far_run(30, 50)
    law = robust_law(n, d, y)
    check, peak = peak_mb(lambda: check_chinchilla(law, n, d, y))
    assert peak < 32, f"{peak:.0f} MiB"
    flagged = [o for o in check.outliers if o.moves]
    assert [o.index for o in flagged] == [y.size - 1]
    # the move is real: the law refitted without that run leaves E's interval
    rest = fit_chinchilla(n[:-1], d[:-1], y[:-1], start=law.fit)
    assert rest.E not in law.intervals(0.95)["E"]
