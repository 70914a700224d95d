"""Scaling-law statistics on data generated from known laws (no mocks, no torch)."""

from __future__ import annotations

import re
import warnings

import numpy as np
import pyarrow as pa
import pytest

from scalelab.analysis.scaling import (
    ChinchillaFit,
    PowerLawFit,
    ScalingError,
    ScalingWarning,
    Trials,
    bootstrap,
    compare_cells,
    compute_equivalent_gain,
    fit_chinchilla,
    fit_isoflop,
    fit_power_law,
    gains,
    pareto_frontier,
)

# Hoffmann et al. (2022), Approach 3 published fit.
CHINCHILLA = ChinchillaFit(E=1.69, A=406.4, B=410.7, alpha=0.34, beta=0.28, n_trials=0)
RESAMPLES = 200


def chinchilla_sweep(seed: int, sigma: float = 0.005) -> tuple[np.ndarray, ...]:
    """80 trials: 10 sizes 50M-10B, each at 8 token/parameter ratios 4-160; log-normal noise."""
    rng = np.random.default_rng(seed)
    n, ratio = np.meshgrid(np.geomspace(5e7, 1e10, 10), np.geomspace(4, 160, 8))
    n, d = n.ravel(), (n * ratio).ravel()
    loss = CHINCHILLA.predict(n, d) * np.exp(rng.normal(0, sigma, n.size))
    return n, d, loss


def compute_law(flops: np.ndarray, seed: int, multiplier: float = 1.0) -> np.ndarray:
    """L(C) = 1.8 + 300 (C/m)^-0.15 with 0.3% noise: a variant needing m x the compute."""
    rng = np.random.default_rng(seed)
    return (1.8 + 300 * (flops / multiplier) ** -0.15) * np.exp(rng.normal(0, 0.003, flops.size))


# --- Chinchilla, Approach 3 ----------------------------------------------------------


def test_chinchilla_fit_recovers_published_constants_within_bootstrap_intervals():
    n, d, loss = chinchilla_sweep(seed=1)
    boot = bootstrap(fit_chinchilla, n, d, loss, n_resamples=RESAMPLES, seed=1)
    assert boot.n_failed == 0
    for name in ("E", "A", "B", "alpha", "beta"):
        assert getattr(CHINCHILLA, name) in boot[name], (name, str(boot[name]))
    # Informative, not vacuous: the exponents and E are pinned down tightly.
    assert boot["alpha"].high - boot["alpha"].low < 0.1
    assert boot["beta"].high - boot["beta"].low < 0.05
    assert boot["E"].high - boot["E"].low < 0.15
    # Derived numbers get intervals too: the exponent of N*(C), and N* at 1e22 FLOPs.
    assert CHINCHILLA.a in boot["a"]
    derived = bootstrap(
        fit_chinchilla,
        n,
        d,
        loss,
        n_resamples=RESAMPLES,
        seed=2,
        derive=lambda f: {"N_opt@1e22": float(f.optimal(1e22)[0])},
    )
    assert float(CHINCHILLA.optimal(1e22)[0]) in derived["N_opt@1e22"]


def test_chinchilla_noiseless_fit_is_exact_and_optimum_satisfies_6nd():
    n, d, loss = chinchilla_sweep(seed=0, sigma=0.0)
    fit = fit_chinchilla(n, d, loss)
    for name in ("E", "A", "B", "alpha", "beta"):
        assert getattr(fit, name) == pytest.approx(getattr(CHINCHILLA, name), rel=0.02)
    n_opt, d_opt = fit.optimal(1e21)
    assert 6 * n_opt * d_opt == pytest.approx(1e21, rel=1e-9)
    # N* minimises loss along the iso-FLOP line: nearby sizes are worse.
    for factor in (0.8, 1.25):
        assert fit.predict(n_opt * factor, d_opt / factor) > fit.predict(n_opt, d_opt)


# --- loss versus compute --------------------------------------------------------------


def test_power_law_recovers_constants_within_intervals():
    flops = np.geomspace(1e15, 1e19, 24)
    boot = bootstrap(fit_power_law, flops, compute_law(flops, seed=3), n_resamples=RESAMPLES)
    assert 1.8 in boot["E"] and 300 in boot["A"] and 0.15 in boot["alpha"]
    assert boot["alpha"].high - boot["alpha"].low < 0.05
    fit = boot.point
    assert fit.flops_at(fit.predict(3e17)) == pytest.approx(3e17, rel=1e-9)
    assert fit.flops_at(fit.E * 0.99) == np.inf  # below E: never reached


def test_pareto_frontier_is_lower_left_envelope():
    flops = np.array([4.0, 1.0, 2.0, 2.0, 3.0, 5.0, 6.0])
    loss = np.array([2.0, 5.0, 4.0, 3.0, 3.5, 2.5, np.nan])
    # By compute: 1 (5.0) new best; 2 twice, the 3.0 one wins; 3 (3.5) dominated by 2@3.0;
    # 4 (2.0) new best; 5 (2.5) dominated; 6 has no loss.
    assert pareto_frontier(flops, loss).tolist() == [1, 3, 0]


# --- IsoFLOP, Approach 2 ---------------------------------------------------------------


def isoflop_sweep(seed: int) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    rows = []
    for c in (1e18, 1e19, 1e20, 1e21):
        n_star = float(CHINCHILLA.optimal(c)[0])
        for n in n_star * np.geomspace(1 / 4, 4, 9):
            d = c / (6 * n)
            rows.append((c, n, d, CHINCHILLA.predict(n, d) * np.exp(rng.normal(0, 0.002))))
    return tuple(np.array(col) for col in zip(*rows, strict=True))


def test_isoflop_parabolas_recover_the_compute_optimum():
    budget, n, d, loss = isoflop_sweep(seed=4)
    fit = fit_isoflop(budget, n, loss, tokens=d)
    assert len(fit.budgets) == 4 and all(o.interior for o in fit.budgets)
    for opt in fit.budgets:
        n_true, d_true = CHINCHILLA.optimal(opt.flops)
        assert opt.n_opt == pytest.approx(float(n_true), rel=0.1)
        assert opt.d_opt == pytest.approx(float(d_true), rel=0.1)
    assert fit.a == pytest.approx(CHINCHILLA.a, abs=0.02)  # 0.452
    assert fit.b == pytest.approx(CHINCHILLA.b, abs=0.02)
    boot = bootstrap(fit_isoflop, budget, n, loss, tokens=d, strata=budget, n_resamples=RESAMPLES)
    assert boot["a"].low < fit.a < boot["a"].high


# --- compute-equivalent gain -----------------------------------------------------------


@pytest.mark.parametrize("law", ["shift", "separate"])
@pytest.mark.parametrize("multiplier", [0.8, 0.5])
def test_gain_recovers_a_known_compute_multiplier(multiplier, law):
    flops = np.geomspace(1e15, 1e19, 16)
    base = Trials("dense", flops, compute_law(flops, seed=5))
    variant = Trials(
        "hadamard", flops * 1.3, compute_law(flops * 1.3, seed=6, multiplier=multiplier)
    )
    gain = compute_equivalent_gain(variant, base, law=law, n_resamples=RESAMPLES, seed=0)
    assert multiplier in gain.multiplier
    assert gain.multiplier.high < 1.0  # the variant is measurably cheaper
    assert gain.reference_flops == pytest.approx(1e19, rel=1e-6)  # top of the overlap
    text = str(gain)
    assert re.fullmatch(
        r"hadamard reaches the dense loss at \d\.\d\d× the FLOPs, 95% CI \[\d\.\d\d, \d\.\d\d\]",
        text,
    ), text


def test_gain_of_identical_law_contains_one_and_at_loss_is_honoured():
    flops = np.geomspace(1e15, 1e19, 16)
    base = Trials("dense", flops, compute_law(flops, seed=7))
    same = Trials("twin", flops, compute_law(flops, seed=8))
    gain = compute_equivalent_gain(same, base, at_loss=2.5, n_resamples=RESAMPLES)
    assert 1.0 in gain.multiplier
    assert gain.reference_loss == 2.5
    sep = compute_equivalent_gain(same, base, law="separate", shared_E=False, n_resamples=50)
    assert not sep.shared_E and sep.fit.baseline.E != sep.fit.variant.E


def test_shift_law_gives_a_usable_interval_from_four_trials_per_variant():
    flops = np.array([1e15, 1e16, 1e17, 1e18])
    base = Trials("dense", flops, compute_law(flops, seed=9))
    variant = Trials("hadamard", flops, compute_law(flops, seed=10, multiplier=0.7))
    gain = compute_equivalent_gain(variant, base, n_resamples=RESAMPLES)
    assert 0.7 in gain.multiplier and gain.multiplier.high < 1.0
    assert gain.fit.baseline.alpha == gain.fit.variant.alpha  # one exponent, shifted in C
    with pytest.raises(ScalingError, match="2 or more compute values"):
        compute_equivalent_gain(Trials("v", flops[:1], variant.loss[:1]), base)


def test_shift_objective_gradient_matches_finite_differences():
    from scipy.optimize import approx_fprime

    from scalelab.analysis.scaling.shift import shift_objective

    rng = np.random.default_rng(3)
    x, y = rng.normal(size=12), np.log(2 + rng.random(12))
    v = (np.arange(12) >= 6).astype(float)
    for _ in range(3):
        theta = np.array([np.log(1.5), rng.normal(), 0.3, 0.2 * rng.normal()])
        numeric = approx_fprime(theta, lambda t: shift_objective(t, x, y, v)[0], 1e-7)
        np.testing.assert_allclose(shift_objective(theta, x, y, v)[1], numeric, rtol=1e-5)


def test_gains_from_a_pyarrow_table_and_per_size_comparison():
    sizes = [f"s{i}" for i in range(6)]
    params = np.geomspace(1e7, 1e9, 6)
    cols = {"variant": [], "size": [], "n_params": [], "flops": [], "final_loss": []}

    def add(variant, size, n, flops, loss):
        for key, value in zip(cols, (variant, size, n, flops, loss), strict=True):
            cols[key].append(value)

    losses = {}
    for variant, m, p_scale, seed in (("dense", 1.0, 1.0, 9), ("hadamard", 0.7, 0.9, 10)):
        flops = 6 * (params * p_scale) * (20 * params)  # same tokens, 0.9x the parameters
        losses[variant] = compute_law(flops, seed=seed, multiplier=m)
        for i in range(6):
            add(variant, sizes[i], params[i] * p_scale, flops[i], losses[variant][i])
    add("dense", "s0", params[0], 6 * params[0] * 20 * params[0], 4.0)  # a second seed
    add("hadamard", "s9", 1e10, 1e22, 2.0)  # a size the baseline never ran
    table = pa.table(cols)

    (gain,) = gains(table, baseline="dense", n_resamples=100)
    assert gain.variant == "hadamard" and 0.7 in gain.multiplier

    with pytest.warns(ScalingWarning, match="hadamard@s9"):
        cmp = compare_cells(table, baseline="dense")
    assert [c.size for c in cmp] == sizes
    for i, c in enumerate(cmp):
        assert c.params_ratio == pytest.approx(0.9)
        assert c.flops_ratio == pytest.approx(0.9)
        assert c.params_diff == pytest.approx(-0.1 * params[i])
        base_loss = (losses["dense"][0] + 4.0) / 2 if i == 0 else losses["dense"][i]
        assert c.loss_diff == pytest.approx(losses["hadamard"][i] - base_loss)
    assert cmp[0].baseline_n_trials == 2 and cmp[1].baseline_n_trials == 1


# --- bad input ---------------------------------------------------------------------------


def test_one_size_empty_and_mismatched_inputs_raise_clear_errors():
    with pytest.raises(ScalingError, match="one size"):
        fit_power_law([1e18] * 5, [3.0, 3.1, 2.9, 3.0, 3.05])
    with pytest.raises(ScalingError, match="one size"):
        fit_chinchilla([1e8] * 8, np.geomspace(1e9, 1e11, 8), np.linspace(3, 2.5, 8))
    with pytest.raises(ScalingError, match="empty"):
        fit_power_law([], [])
    with pytest.raises(ScalingError, match="loss has 3"):
        fit_power_law([1e15, 1e16], [3.0, 2.9, 2.8])
    with pytest.raises(ScalingError, match="n_params must be finite and > 0"):
        fit_chinchilla([0, 1e8, 1e9] * 2, [1e9, 1e10, 1e11] * 2, [3.0] * 6)
    with pytest.raises(ScalingError, match="compute budgets"):
        fit_isoflop([1e18] * 5, np.geomspace(1e7, 1e9, 5), [3, 2.9, 2.8, 2.9, 3.0])
    assert issubclass(ScalingError, ValueError)


def test_nan_losses_are_dropped_with_a_warning_and_all_nan_refused():
    flops = np.geomspace(1e15, 1e19, 12)
    loss = compute_law(flops, seed=10)
    with_nan = loss.copy()
    with_nan[[2, 7]] = np.nan
    with pytest.warns(ScalingWarning, match="dropped 2 of 12"):
        fit = fit_power_law(flops, with_nan)
    keep = np.isfinite(with_nan)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        clean_fit = fit_power_law(flops[keep], loss[keep])
    assert fit == clean_fit
    with pytest.raises(ScalingError, match="all 12 losses are NaN"):
        fit_power_law(flops, np.full(12, np.nan))


def test_variant_without_baseline_and_isoflop_without_minimum_raise():
    table = {
        "variant": np.array(["hadamard"] * 4),
        "flops": np.geomspace(1e15, 1e18, 4),
        "final_loss": np.array([3.0, 2.8, 2.6, 2.5]),
    }
    with pytest.raises(ScalingError, match="no baseline: variant 'dense'"):
        gains(table, baseline="dense")
    with pytest.raises(ScalingError, match="no baseline"):
        compare_cells(
            {**table, "size": np.array(["a", "b", "c", "d"]), "n_params": np.ones(4)},
            baseline="dense",
        )
    with pytest.raises(ScalingError, match="no column 'tokens'"):
        Trials.from_table(table, "hadamard", loss="tokens")
    log_n = np.log(np.geomspace(1e7, 1e9, 5))
    concave = 3.0 - 0.01 * (log_n - log_n.mean()) ** 2  # a maximum, not a minimum
    with pytest.raises(ScalingError, match="does not curve upwards"):
        fit_isoflop([1e18] * 5 + [1e19] * 5, np.exp(np.tile(log_n, 2)), np.tile(concave, 2))


def test_bootstrap_is_seeded_and_resamples_within_strata():
    flops = np.geomspace(1e15, 1e19, 12)
    loss = compute_law(flops, seed=11)
    a = bootstrap(fit_power_law, flops, loss, n_resamples=30, seed=5)
    b = bootstrap(fit_power_law, flops, loss, n_resamples=30, seed=5)
    c = bootstrap(fit_power_law, flops, loss, n_resamples=30, seed=6)
    assert np.array_equal(a.samples["alpha"], b.samples["alpha"])
    assert not np.array_equal(a.samples["alpha"], c.samples["alpha"])
    assert isinstance(a.point, PowerLawFit) and a.n_resamples == 30
    with pytest.raises(ScalingError, match="n_resamples"):
        bootstrap(fit_power_law, flops, loss, n_resamples=0)


def test_log_space_objective_gradient_matches_finite_differences():
    from scipy.optimize import approx_fprime

    from scalelab.analysis.scaling.objective import LogLaw

    rng = np.random.default_rng(12)
    mask = rng.random((60, 2)) > 0.5
    mask[:, 0] |= ~mask[:, 1]
    law = LogLaw(X=rng.normal(size=(60, 2)), y=1 + 0.01 * rng.normal(size=60), mask=mask)
    theta = np.array([0.5, 0.2, -0.3, 0.3, 0.4])
    value, grad = law.objective_and_grad(theta)
    assert value == pytest.approx(float(law.objective(theta)))
    numeric = approx_fprime(theta, lambda t: law.objective_and_grad(t)[0], 1e-7)
    np.testing.assert_allclose(grad, numeric, rtol=1e-4, atol=1e-3)


def test_per_cell_comparison_keeps_token_budgets_apart_and_averages_only_seeds():
    """Two token budgets per size, two seeds per cell: a row per (size, tokens) whose loss is
    the mean over that cell's seeds, never a mean over budgets (the demo's nano row once
    showed 3.401 = the mean of 3.859 at 32k tokens and 2.944 at 98k)."""
    cols = {"variant": [], "size": [], "tokens": [], "seed": [], "n_params": [], "flops": [],
            "final_loss": []}  # fmt: skip
    truth = {}
    for variant, gap in (("dense", 0.0), ("hadamard", -0.02)):
        for size, n in (("nano", 1.2e5), ("tiny", 3.7e5)):
            for tokens in (32768, 98304):
                for seed in (0, 1):
                    loss = 3.0 + 2e4 / n + 1e4 / tokens + gap + 0.01 * seed
                    truth.setdefault((variant, size, tokens), []).append(loss)
                    for key, value in zip(cols, (variant, size, tokens, seed, n,
                                                 6 * n * tokens, loss), strict=True):  # fmt: skip
                        cols[key].append(value)
    rows = compare_cells(pa.table(cols), baseline="dense")
    assert len(rows) == 4  # (nano, tiny) x (32768, 98304), hadamard against dense
    for r in rows:
        key = (r.size, dict(r.cell)["tokens"])
        assert r.loss == pytest.approx(np.mean(truth[("hadamard", *key)]))
        assert r.baseline_loss == pytest.approx(np.mean(truth[("dense", *key)]))
        assert r.loss_diff == pytest.approx(-0.02) and r.n_trials == r.baseline_n_trials == 2
        assert r.n_pairs == 2 and r.loss_diff_se == pytest.approx(0.0, abs=1e-12)
