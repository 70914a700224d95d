import math

import numpy as np
import pytest

from scalelab.orchestrator.plan.lr_optimum import RateOptimum, rate_optimum, rounded, transfer_holds

RATES = [1e-4 * 2**k for k in range(7)]


def parabola(optimum: float, noise: float = 1e-4, seed: int = 0) -> list[float]:
    jitter = np.random.default_rng(seed).normal(scale=noise, size=len(RATES))
    return [
        3 + 0.2 * (math.log(r) - math.log(optimum)) ** 2 + e
        for r, e in zip(RATES, jitter, strict=True)
    ]


def test_known_parabola_vertex_and_interval():
    opt = rate_optimum(RATES, parabola(1.3e-3))
    assert opt.fitted and not opt.at_edge
    assert opt.points == 5
    assert opt.rate == pytest.approx(1.3e-3, rel=0.02)
    assert opt.low < 1.3e-3 < opt.high
    assert opt.rate_text().startswith("1.3e-03 [")


def test_unsorted_input_gives_the_same_optimum():
    losses = parabola(1.3e-3)
    opt = rate_optimum(RATES[::-1], losses[::-1])
    assert opt.rates == tuple(RATES)
    assert opt.rate == pytest.approx(rate_optimum(RATES, losses).rate)


def test_optimum_beyond_the_grid_is_flagged():
    losses = [5.0 - 0.1 * k for k in range(len(RATES))]
    opt = rate_optimum(RATES, losses)
    assert opt.at_edge and not opt.fitted
    assert opt.rate == RATES[-1]
    assert math.isnan(opt.low) and math.isnan(opt.high)
    assert opt.rate_text() == "6.4e-03 (best grid point)"


def test_diverged_point_is_left_out():
    losses = parabola(1.3e-3)
    losses[-1] = math.nan
    opt = rate_optimum(RATES, losses)
    assert opt.fitted and not opt.at_edge
    assert opt.points == 4  # best at 1.6e-3: two finite below, one finite above
    assert opt.rate == pytest.approx(1.3e-3, rel=0.02)
    assert opt.low < 1.3e-3 < opt.high


def test_best_point_beside_a_divergence_is_not_at_the_edge():
    losses = parabola(1.3e-3)
    losses[-1], losses[-2] = math.nan, math.inf
    opt = rate_optimum(RATES, losses)
    assert not opt.at_edge
    assert opt.points == 3 and opt.fitted


def test_three_points_fit_without_interval():
    opt = rate_optimum([1e-3, 2e-3, 4e-3], [3.5, 3.0, 3.2])
    assert opt.fitted and opt.points == 3
    assert 1e-3 < opt.rate < 4e-3
    assert math.isnan(opt.low) and math.isnan(opt.high)
    assert "no interval" in opt.rate_text()


def test_perfect_fit_has_zero_width_interval():
    losses = [(math.log(r) - math.log(1e-3)) ** 2 for r in RATES]
    opt = rate_optimum(RATES, losses)
    assert opt.low == pytest.approx(opt.rate) and opt.high == pytest.approx(opt.rate)


@pytest.mark.parametrize(
    ("rates", "losses", "match"),
    [
        ([1e-3, 2e-3], [1.0, 2.0], "at least 3"),
        ([-1e-3, 1e-3, 2e-3], [1.0, 2.0, 3.0], "positive"),
        ([1e-3, 1e-3, 2e-3], [1.0, 2.0, 3.0], "distinct"),
        ([1e-3, 2e-3, 4e-3], [math.nan, math.inf, math.nan], "every rate diverged"),
    ],
)
def test_validation(rates, losses, match):
    with pytest.raises(ValueError, match=match):
        rate_optimum(rates, losses)


def test_transfer_holds():
    same = [rate_optimum(RATES, parabola(1.3e-3, seed=s)) for s in (1, 2)]
    assert transfer_holds(same)
    apart = [rate_optimum(RATES, parabola(r)) for r in (5e-4, 2e-3)]
    assert all(o.high / o.low < 1.5 for o in apart)
    assert not transfer_holds(apart)
    assert transfer_holds(apart[:1]) and transfer_holds([])


def test_transfer_without_interval_uses_grid_spacing():
    # Three-point fits: no interval, so each counts as half a grid step (ln 2 / 2) wide.
    near = rate_optimum([1e-3, 2e-3, 4e-3], [3.5, 3.0, 3.4])
    near2 = rate_optimum([1e-3, 2e-3, 4e-3], [3.4, 3.0, 3.5])
    assert transfer_holds([near, near2])
    far = rate_optimum([1e-2, 2e-2, 4e-2], [3.5, 3.0, 3.4])
    assert not transfer_holds([near, far])


def test_rounded():
    assert rounded(0.0012345) == 0.00123
    assert rounded(rounded(0.0012345)) == rounded(0.0012345)
    assert rounded(0.0012345, digits=2) == 0.0012


def test_best_grid_points_two_steps_apart_do_not_transfer_whatever_the_intervals():
    """A flat bowl's wide interval hides no move the grid itself shows (the standard
    parametrisation's optimum at d 32 and d 128 in docs/reproducing/baseline.md)."""
    rates = (1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2)

    def optimum(losses: tuple[float, ...], rate: float) -> RateOptimum:
        return RateOptimum(rates, losses, rate, 1e-4, 1e-1, 0.95, True, 5, False)

    narrow = optimum((3.08, 2.81, 2.73, 3.04, 3.02), 3.8e-3)  # best at 4e-3
    wide = optimum((2.58, 2.69, 2.92, 2.89, 2.95), 1.7e-3)  # best at 1e-3: two steps down
    assert not transfer_holds([narrow, wide])
    one_step = optimum((2.70, 2.60, 2.75, 2.90, 2.95), 2.5e-3)  # best at 2e-3: one step
    assert transfer_holds([narrow, one_step])
    assert "wider than the grid" in wide.rate_text()
