"""`results fit` and the forecast on tables of many rows: every curve point of a ladder
imported as a row. What is computed differently beyond a size (docs/scaling.md, "At
scale") gives what the exact computation gives, in memory that does not grow with the
square of the rows or with the number of resamples. Memory is measured with tracemalloc
(numpy's arrays are traced); no timing is asserted (the machines are shared)."""

from __future__ import annotations

import functools
import importlib
import itertools
import tracemalloc
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from synthetic_ladder import as_trials

from scalelab.analysis.scaling import ChinchillaFit, bootstrap, fit_chinchilla
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


def test_grid_search_on_many_rows_lands_where_the_full_search_does():
    """2,500 rows (over chinchilla.GRID_ROWS): the grid and its starts on a subsample, the
    last descent on every row, give the optimum of the grid and starts on every row."""
    from scalelab.analysis.scaling.objective import LogLaw, centre, minimise, uncentre

    chinchilla = importlib.import_module("scalelab.analysis.scaling.chinchilla")
    n, d, y = curves(50, 50)
    fit = fit_chinchilla(n, d, y)
    log_x = np.log(np.column_stack([n, d]))
    shift = log_x.mean(axis=0)
    grid = np.array(list(itertools.product(*chinchilla._GRID.values())))
    theta, _ = minimise(LogLaw(log_x - shift, np.log(y)), centre(grid, shift))
    full = dict(zip(("E", "A", "B", "alpha", "beta"), uncentre(theta, shift), strict=True))
    full.update(E=np.exp(full["E"]), A=np.exp(full["A"]), B=np.exp(full["B"]))
    for k, v in full.items():
        assert getattr(fit, k) == pytest.approx(v, rel=1e-5), k


def test_fit_chinchilla_on_20000_rows_searches_its_grid_in_bounded_memory():
    """The grid of 6,480 starts was evaluated 512 at a time on every row: (512, n, 3)
    arrays, 245 MB each at 20,000 rows (GBs at 100,000: the 5.1 GB of the issue)."""
    n, d, y = curves(200, 100)
    fit, peak = peak_mb(lambda: fit_chinchilla(n, d, y))
    assert peak < 64, f"{peak:.0f} MiB"
    again = fit_chinchilla(n, d, y, start=fit)  # an optimum: a descent from it stays
    assert np.allclose(list(again.values().values()), list(fit.values().values()), rtol=1e-6)
    assert abs(fit.alpha - LAW.alpha) < 0.01 and abs(fit.beta - LAW.beta) < 0.01


def test_linearised_bootstrap_agrees_draw_by_draw_with_refitting_each_resample():
    """1,500 rows (over bootstrap.EXACT_ROWS): each resample refit as the linearised law
    (the same resamples: no strata) against L-BFGS-B on each resample's rows."""
    from scalelab.analysis.scaling.chinchilla import bootstrap_chinchilla

    n, d, y = curves(30, 50)
    fast = bootstrap_chinchilla(n, d, y, n_resamples=60, seed=3)
    exact = bootstrap(fit_chinchilla, n, d, y, n_resamples=60, seed=3)
    assert fast.point == exact.point and fast.n_failed == exact.n_failed == 0
    for k in ("E", "A", "B", "alpha", "beta", "a", "b", "G"):
        a, b = exact.samples[k], fast.samples[k]
        assert np.sqrt(np.mean((a - b) ** 2)) < 0.1 * a.std(), k  # measured: 0.5-7%
        width = exact[k].high - exact[k].low
        assert abs(fast[k].low - exact[k].low) < 0.05 * width, k
        assert abs(fast[k].high - exact[k].high) < 0.05 * width, k


def test_bootstrap_of_20000_rows_never_holds_every_resample_at_once():
    """1,000 resamples of 20,000 rows: the (1000, 20000) index array of the row bootstrap
    alone is 160 MB, and a copy of the rows per resample fed L-BFGS-B."""
    from scalelab.analysis.scaling.chinchilla import bootstrap_chinchilla

    n, d, y = curves(200, 100)
    boot, peak = peak_mb(lambda: bootstrap_chinchilla(n, d, y, n_resamples=1000))
    assert peak < 64, f"{peak:.0f} MiB"
    assert boot.n_failed == 0 and all(s.size == 1000 for s in boot.samples.values())
    for k in ("alpha", "beta"):  # tight, and about the truth (within ~4 standard errors)
        iv, width = boot[k], boot[k].high - boot[k].low
        assert width < 0.02 and abs(iv.estimate - getattr(LAW, k)) < 2 * width


def test_unpaired_gain_beyond_the_exact_size_matches_refitting_each_resample():
    """2 x 800 trials: the compute-shifted law's linearised resamples against L-BFGS-B
    on each resample (the same draws: one batch holds them all)."""
    gain = importlib.import_module("scalelab.analysis.scaling.gain")
    rng = np.random.default_rng(0)
    c = np.geomspace(1e17, 1e21, 800)
    base = gain.Trials("dense", c, (1.8 + 300 * c**-0.15) * np.exp(rng.normal(0, 0.01, c.size)))
    var = gain.Trials("other", c * 1.1,
                      (1.8 + 300 * (c * 1.1 / 0.85) ** -0.15) * np.exp(rng.normal(0, 0.01, c.size)))  # fmt: skip
    fast = gain.compute_equivalent_gain(var, base, n_resamples=200)
    flops, loss = np.r_[base.flops, var.flops], np.r_[base.loss, var.loss]
    group = np.r_[np.zeros(c.size, int), np.ones(c.size, int)]
    fit = functools.partial(gain._fit_pair, shared_E=True, frontier=False, at_loss=None,
                            c_ref=float(c.max()), law="shift")  # fmt: skip
    exact = bootstrap(fit, flops, loss, group, n_resamples=200, strata=group)
    assert fast.fit == exact.point or fast.multiplier.estimate == exact["multiplier"].estimate
    width = exact["multiplier"].high - exact["multiplier"].low
    assert abs(fast.multiplier.low - exact["multiplier"].low) < 0.05 * width
    assert abs(fast.multiplier.high - exact["multiplier"].high) < 0.05 * width
    assert 0.85 in fast.multiplier


def test_fit_of_3000_curve_points_stays_in_bounded_memory():
    """`results fit`'s fit_table on every curve point of 30 runs (3,000 rows): the laws,
    the bootstrap, the checks and the backtest, in memory far below the n^2 the influence
    check once took (3,000^2 x 5 floats = 360 MB for one of its arrays)."""
    from scalelab.analysis.results.fit import fit_table

    n, d, y = curves(30, 100)
    sizes = np.array([f"s{i}" for i in np.unique(n, return_inverse=True)[1]])
    table = as_trials(pa.table({"variant": ["dense"] * y.size, "size": sizes, "tokens": d,
                                "seed": [0] * y.size, "n_params": n, "flops": 6 * n * d,
                                "final_loss": y}))  # fmt: skip
    fit, peak = peak_mb(lambda: fit_table(table, "curves", n_resamples=200))
    assert peak < 200, f"{peak:.0f} MiB"
    assert LAW.alpha in fit.chinchilla["dense"]["alpha"]
    assert "dense" in fit.chinchilla_checks and fit.backtest is not None


@pytest.mark.parametrize("has_E", [True, False])
def test_the_refits_law_and_jacobian_are_the_objectives_number_for_number(has_E: bool):
    """refine.predict_and_jacobian (the batched refits' inner loop, written term by term
    for speed) against objective.LogLaw, one problem at a time: equal, not close."""
    from scalelab.analysis.scaling.objective import LogLaw
    from scalelab.analysis.scaling.refine import predict_and_jacobian

    rng = np.random.default_rng(4)
    X = rng.normal(0, 2, (3, 200, 2))
    theta = np.column_stack([rng.normal(0, 1, (3, 3 if has_E else 2)), rng.uniform(0.1, 1, (3, 2))])
    value, jac = predict_and_jacobian(X, theta, has_E)
    for b in range(3):
        law = LogLaw(X=X[b], y=np.zeros(200), has_E=has_E)
        r, j = law.residuals_and_jacobian(theta[b])
        assert np.array_equal(value[b], r) and np.array_equal(jac[b], j)


def test_calibration_beyond_its_cap_keeps_every_fold_on_fewer_rows(monkeypatch):
    """Beyond robust.CALIBRATION_ROWS the misfit and forward folds see a thinned copy of
    the rows (every size, with its smallest and largest token count): the same folds and
    distances, the fit's own scale and covariance from every row, and q about what the
    folds on every row give (measured on 3 ladders: within 7-15%). The folds once refit
    ~every row per size: ~150 CPU s and ~4.6 GB on 100,000 curve points of 250 runs."""
    robust = importlib.import_module("scalelab.analysis.scaling.robust")
    n, d, y = curves(40, 60)
    fit = fit_chinchilla(n, d, y)
    exact = robust_law(n, d, y, fit=fit)  # 2,400 rows: under the cap, every row
    monkeypatch.setattr(robust, "CALIBRATION_ROWS", 800)
    rows = robust.calibration_rows(np.log(n), np.log(d))
    assert rows is not None and rows.size == 800
    for size in np.unique(n):
        kept = d[rows][n[rows] == size]
        assert kept.size == 20
        assert kept.min() == d[n == size].min() and kept.max() == d[n == size].max()
    thin = robust_law(n, d, y, fit=fit)
    assert (exact.calibrated_on, thin.calibrated_on) == (0, 800)
    assert thin.n_folds == exact.n_folds and thin.reach.n_folds == exact.reach.n_folds
    assert thin.reach.distance.max() == exact.reach.distance.max()
    assert thin.scale == exact.scale and np.array_equal(thin.stack.cov, exact.stack.cov)
    assert thin.per_distance == pytest.approx(exact.per_distance, rel=0.25)
    assert thin.misfit == pytest.approx(exact.misfit, abs=0.002)
