"""What to run next: how much each extra run would narrow the paired gain's interval, and
the cheapest way to tell a given compute gain from none: the gain this sweep measured (when
its interval still spans 1) and a target gain (`effect`, the smallest worth having), each
said with which one it is, so the advice cannot read as contradicting the gain table.

An analytic power estimate on the paired estimator (paired.py). Its standard error is

    se^2 = sigma^2 / sum_i w_i  +  (log m * r)^2

the pairs' scatter over their total weight w_i = s_i^2, plus the share of the baseline's
slope s, whose relative standard error r shrinks only with more cells or a wider compute
range (more seeds of a cell leave its offset from the law as it is). To tell a gain g from
none (two-sided, level 1 - a) with power 1 - b, the interval half-width must satisfy

    (t(1 - a/2; n - 1) + t(1 - b; n - 1)) * se  <=  |log(1 - g)|

with se evaluated at log m = log(1 - g). Each option (more seeds per cell, one more size,
one more budget) adds pairs of known weight and, for new cells, a point of known compute to
the slope's fit; the cheapest option that meets the target is the advice. sigma is this
sweep's estimate (n - 1 degrees of freedom): with few pairs it is itself uncertain, and the
advice is a plan, not a promise.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats

from .paired import PairedGain


@dataclass(frozen=True)
class Option:
    """A candidate addition to the sweep, described by what the estimator would gain."""

    label: str  # e.g. "2 more seeds per cell", "size mini at every budget"
    n_pairs: int  # pairs it adds
    new_flops: tuple[float, ...]  # baseline compute of the new cells (empty: no new cells)
    cost_flops: float  # training FLOPs of its trials (variant and baseline)
    n_trials: int


@dataclass(frozen=True)
class Projection:
    option: Option
    half_width: float  # projected half-width of the interval of log m at the target gain
    power: float  # projected power to tell the target gain from none
    meets_target: bool


@dataclass(frozen=True)
class Advice:
    """What to run next for one variant, for two effect sizes: the gain this sweep measured
    (is it told from none yet; if not, the smallest addition that would tell it) and the
    target `effect` (--effect: the smallest gain worth telling from none, asked of every
    variant alike, whatever this sweep measured)."""

    variant: str
    baseline: str
    effect: float  # g: the compute gain to tell from none (0.05 = 5%)
    level: float
    power: float
    current: Projection  # the sweep as it is, for `effect`
    projections: tuple[Projection, ...]
    best: Projection | None  # the cheapest option that meets the target
    multiplier: float = float("nan")  # the measured m (compute ratio; < 1: cheaper)
    resolved: bool = False  # the measured m's interval excludes 1
    for_measured: Projection | None = None  # the cheapest option that would resolve m

    @property
    def measured(self) -> str:
        """The measured gain in words: '20% less compute', '8% more compute'."""
        m = self.multiplier
        if not np.isfinite(m):
            return "no finite gain"
        return f"{1 - m:.0%} less compute" if m <= 1 else f"{m - 1:.0%} more compute"

    def measured_line(self) -> str:
        """Whether the measured gain is told from none, and the smallest addition if not."""
        head = f"{self.variant}: the measured gain ({self.measured}, m = {self.multiplier:.2f})"
        if self.resolved:
            return f"{head} is told from none already: its {self.level:.0%} interval excludes 1"
        if self.for_measured is None:
            return (
                f"{head} is not told from none, and none of the options tried would tell a "
                f"gain that small at {self.level:.0%} with {self.power:.0%} power"
            )
        o = self.for_measured.option
        return (
            f"{head} is not told from none yet; the smallest addition that would tell it at "
            f"{self.level:.0%} ({self.power:.0%} power): {o.label} ({o.n_trials} trials, "
            f"{o.cost_flops:.3g} FLOPs)"
        )

    def target_line(self) -> str:
        """The advice for the target effect, saying it is the target and not the measure."""
        g = f"a gain as small as {self.effect:.0%} (--effect: the smallest worth telling)"
        if self.current.meets_target:
            return (
                f"{self.variant}: this sweep already tells {g} from none at "
                f"{self.level:.0%} ({self.current.power:.0%} power)"
            )
        if self.best is None:
            return (
                f"{self.variant}: none of the options tried tells {g} from none at "
                f"{self.level:.0%} with {self.power:.0%} power; the scatter of the pairs "
                "is too large for this design (a larger effect, or many more seeds)"
            )
        o = self.best.option
        return (
            f"{self.variant}: to tell {g} from none at {self.level:.0%} "
            f"({self.power:.0%} power), add {o.label} ({o.n_trials} trials, "
            f"{o.cost_flops:.3g} FLOPs)"
        )

    def __str__(self) -> str:
        return f"{self.measured_line()}; {self.target_line().split(': ', 1)[1]}"


def advise(
    gain: PairedGain,
    slope_rel_se: float,
    slope_design: np.ndarray,
    options: list[Option],
    *,
    effect: float = 0.05,
    power: float = 0.8,
) -> Advice:
    """Project each option's interval for the target `effect` (module doc).
    `slope_rel_se` is the relative standard error of the baseline's slope and
    `slope_design` the log compute of the cells it was fitted on (to project how new
    cells narrow it)."""
    level = gain.multiplier.level
    target = abs(np.log1p(-effect))
    s = float(np.sqrt(gain.weights.mean()))  # the slope where the pairs are
    x = np.asarray(slope_design, dtype=float)
    sxx = float(((x - x.mean()) ** 2).sum())

    def project(option: Option, target: float = target) -> Projection:
        weight = float(gain.weights.sum()) + option.n_pairs * s**2
        n = gain.n_pairs + option.n_pairs
        rel = slope_rel_se
        if option.new_flops and sxx > 0:
            x2 = np.concatenate([x, np.log(option.new_flops)])
            rel *= np.sqrt(sxx / float(((x2 - x2.mean()) ** 2).sum()))
        se = float(np.sqrt(gain.sigma**2 / weight + (target * rel) ** 2))
        dof = n - 1
        t_level = float(stats.t.ppf((1 + level) / 2, dof))
        achieved = float(stats.t.cdf(target / se - t_level, dof)) if se > 0 else 1.0
        return Projection(option, t_level * se, achieved, achieved >= power)

    current = project(Option("nothing", 0, (), 0.0, 0))
    projections = tuple(project(o) for o in options)
    meeting = [p for p in projections if p.meets_target]
    best = min(meeting, key=lambda p: p.option.cost_flops) if meeting else None
    m = gain.multiplier
    resolved = bool(m.high < 1 or m.low > 1)
    for_measured = None
    if not resolved and np.isfinite(m.estimate) and m.estimate > 0 and m.estimate != 1:
        measured = abs(float(np.log(m.estimate)))  # the measured effect, as a target
        told = [p for p in (project(o, measured) for o in options) if p.meets_target]
        for_measured = min(told, key=lambda p: p.option.cost_flops) if told else None
    return Advice(gain.variant, gain.baseline, effect, level, power, current, projections, best,
                  float(m.estimate), resolved, for_measured)  # fmt: skip
