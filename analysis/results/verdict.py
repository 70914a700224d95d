"""The end-of-sweep summary in words (docs/architecture.md, step 6; docs/results.md, 'The
summary'): the verdict first, one line per variant against the baseline; the fit checks
folded into one line that points at the report; the forecast backtest in one line; and one
`next:` recommendation per variant, priced on the hardware the sweep runs on.

Nothing here is a new statistic: the verdict reads the paired gain (paired.py: the loss
ratio of trials with the same cell and seed, the FLOPs of the two sides of each pair, and
the compute multiplier m that turns both into one number), the fit checks are the FitChecks
the report lists, and the recommendation is one of the two the advice already computes
(analysis/scaling/power_analysis.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from scalelab.analysis.scaling import Interval, PairedGain
    from scalelab.analysis.scaling.checks import FitCheck
    from scalelab.analysis.scaling.power_analysis import Advice

    from .advice import Costing
    from .fit import SweepFit
    from .loss_forecast import Forecast

SAME_FLOPS = 0.005  # FLOPs ratios within 0.5% of 1 read as "the same FLOPs"


def verdict_lines(fit: SweepFit) -> list[str]:
    """The summary's first lines: whether any variant beats the baseline at equal compute,
    then one line per variant saying what its comparison holds fixed and what it found."""
    b = fit.baseline
    found: dict[str, list[str]] = {"beats": [], "costlier": [], "open": []}
    lines = []
    for v in fit.variants:
        if v == b:
            continue
        p = fit.paired_gain(v)
        g = next((g for g in fit.gains if g.variant == v), None)
        if p is not None:
            lines.append(f"  {paired_verdict(p, fit.axes)}")
            m = p.multiplier
        elif g is not None:  # no pairs (different cells): the laws through each variant
            m = g.multiplier
            lines.append(
                f"  {v}: no trial pairs with {b} (same cell and seed); from the laws through "
                f"each variant's trials, at equal compute {_compute_reading(m, b)}"
            )
        else:
            lines.append(f"  {v}: no comparison with {b} (the notes below say why)")
            continue
        found[_side(m)].append(v)
    if not lines:
        return []
    level = f"{fit.level:.0%}"
    if found["beats"]:
        head = f"{_names(found['beats'])} {'beat' if len(found['beats']) > 1 else 'beats'} {b}"
        head += " at equal compute"
    else:
        head = f"no variant beats {b} at equal compute yet"
    if found["open"] and found["beats"]:
        head += f"; no clear gain yet: {_names(found['open'])}"
    if found["costlier"]:
        head += f"; costlier than {b}: {_names(found['costlier'])}"
    return [f"verdict: {head} ({level} intervals)"] + lines


def paired_verdict(p: PairedGain, axes: tuple[str, ...] | list[str]) -> str:
    """One variant against the baseline from its paired gain: the loss at equal cell (what
    the cell holds fixed, by name), the FLOPs the variant spends there, and the two
    together as the compute multiplier m (the gains table's reading)."""
    b, r = p.baseline, p.loss_ratio
    held = _held(axes)
    interval = f"[{_pct(r.low - 1, '+')}, {_pct(r.high - 1, '+')}]"
    if r.high < 1:
        loss, sign = f"{_pct(1 - r.estimate)} lower loss than {b} at {held} {interval}", -1
    elif r.low > 1:
        loss, sign = f"{_pct(r.estimate - 1)} higher loss than {b} at {held} {interval}", 1
    else:
        loss = f"no measurable difference from {b} at {held} (loss {_pct(r.estimate - 1, '+')} "
        loss += f"{interval})"
        sign = 0
    ratio = p.pairs.flops / p.pairs.baseline_flops
    spend, more = _flops_words(float(ratio.min()), float(ratio.max()))
    compute = f"at equal compute, {_compute_reading(p.multiplier, b)}"
    if spend == "the same FLOPs":
        return f"{p.variant}: {loss}, on the same FLOPs: {compute}"
    joint = "; it" if 0 in (sign, more) else (", and" if sign == more else ", but")
    return f"{p.variant}: {loss}{joint} {spend}: {compute}"


def _pct(x: float, sign: str = "") -> str:
    """A share with one decimal, two where one would print 0.0% (a loss Δ of -0.04%)."""
    digits = 1 if abs(x) >= 0.0005 or x == 0 else 2
    return f"{x:{sign}.{digits}%}"


def _held(axes: tuple[str, ...] | list[str]) -> str:
    """'equal size and tokens': what a pair's cell holds fixed (design.py's axes)."""
    from .design import axis_label

    names = {"budget_flops": "FLOPs budget", "flops": "FLOPs budget",
             "tokens_per_param": "tokens per parameter"}  # fmt: skip
    words = [names.get(axis_label(a), axis_label(a)) for a in axes]
    if not words:
        return "equal settings"
    return "equal " + (words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1])


def _flops_words(low: float, high: float) -> tuple[str, int]:
    """The variant's FLOPs over the baseline's across the pairs, in words, and which way
    (1: more, -1: fewer, 0: the same or both ways)."""
    if abs(low - 1) <= SAME_FLOPS and abs(high - 1) <= SAME_FLOPS:
        return "the same FLOPs", 0
    if low >= 1 - SAME_FLOPS:
        return f"spends {_span(low - 1, high - 1)} more FLOPs", 1
    if high <= 1 + SAME_FLOPS:
        return f"uses {_span(1 - high, 1 - low)} fewer FLOPs", -1
    return f"spends from {1 - low:.0%} fewer to {high - 1:.0%} more FLOPs", 0


def _span(a: float, b: float) -> str:
    lo, hi = f"{max(a, 0):.0%}", f"{b:.0%}"
    if lo == hi:
        return hi
    return f"up to {hi}" if lo == "0%" else f"{lo[:-1]}–{hi}"


def _compute_reading(m: Interval, baseline: str) -> str:
    """The compute multiplier in words, as the gains table reads it (render.reading)."""
    ci = f"[{m.low:.2f}×, {m.high:.2f}×]"
    if not np.isfinite(m.estimate):
        return f"it never reaches {baseline}'s loss on its fitted law"
    if m.high < 1:
        return (
            f"{1 - m.estimate:.0%} cheaper: {baseline}'s loss at {m.estimate:.2f}× the FLOPs {ci}"
        )
    if m.low > 1:
        return f"costlier: {baseline}'s loss at {m.estimate:.2f}× the FLOPs {ci}"
    return f"no clear gain ({baseline}'s loss at {m.estimate:.2f}× the FLOPs {ci})"


def _side(m: Interval) -> str:
    if np.isfinite(m.estimate) and m.high < 1:
        return "beats"
    if not np.isfinite(m.estimate) or m.low > 1:
        return "costlier"
    return "open"


def _names(variants: list[str]) -> str:
    return ", ".join(variants)


# what each problem of a FitCheck is called in the folded line, in the order it is listed
_KINDS = (
    ("fallback", "fell back to a simpler law"),
    ("on_bound", "with a constant on its bound"),
    ("unidentified", "not pinned down by the data"),
    ("wide", "with an interval over an order of magnitude"),
    ("outliers", "with points off the law"),
    ("regime", "outside the power-law regime"),
)


def fit_checks_line(fit: SweepFit, report: str = "report.md") -> str:
    """Every fitted law's check (L(C) and L(N, D) per variant, and any registered law's),
    the unpaired gains' common law and the forecast backtest, folded into one line that
    points at the report, which lists each one ('Fits to read with care')."""
    checks: list[FitCheck] = [check for _, _, check in fit.checks()]
    flagged = [c for c in checks if not c.ok]
    parts = []
    if checks:
        counts = [(sum(bool(getattr(c, k)) for c in flagged), words) for k, words in _KINDS]
        kinds = ", ".join(f"{n} {words}" for n, words in counts if n)
        if flagged:
            parts.append(f"{len(flagged)} of {len(checks)} laws to read with care ({kinds})")
        else:
            n = len(checks)
            parts.append(f"the {n} fitted law{'s pass' if n > 1 else ' passes'}")
    fell = [g.variant for g in fit.gains if g.fit.baseline.fallback]
    if fell:
        parts.append(f"the unpaired gains' law fell back to a simpler one ({_names(fell)})")
    if fit.backtest is not None and fit.backtest.notes:
        n = len(fit.backtest.notes)
        parts.append(f"the forecast backtest has {n} caveat{'s' if n > 1 else ''}")
    if not parts:
        return ""
    line = "fit checks: " + "; ".join(parts)
    if flagged or fell or (fit.backtest is not None and fit.backtest.notes):
        line += f" — see 'Fits to read with care' in {report}"
    return line


def backtest_line(b: Forecast) -> str:
    """The forecast backtest in one line: how many held-out runs fell inside their
    prediction intervals (the report's table has each one)."""
    level = b.predictions[0].level
    inside = sum(b.covered)
    useless = sum(not b.useful(p) for p in b.predictions)
    text = (
        f"{b.title()}: {inside} of {len(b.predictions)} held-out runs inside their "
        f"{level:.0%} prediction intervals"
    )
    if useless:
        text += f" ({useless} wider than the fitted runs' losses: no useful forecast)"
    return text


def next_line(advice: Advice, cost: Costing) -> str:
    """One recommendation per variant, the one that agrees with the gains table: nothing to
    add when its interval already excludes 1; else the addition that would tell from none
    the larger of the measured gain and the smallest gain worth telling (--effect), since
    the smaller of the two needs more runs and is not worth them."""
    a, v = advice, advice.variant
    level, power = f"{a.level:.0%}", f"{a.power:.0%} power"
    if a.resolved:
        return (
            f"{v}: nothing to add to tell it from {a.baseline}: its measured gain "
            f"({a.measured}) is told from none already ({level} interval excludes 1)"
        )
    measured = abs(float(np.log(a.multiplier))) if np.isfinite(a.multiplier) else 0.0
    if measured >= abs(float(np.log1p(-a.effect))):
        what = f"its measured gain ({a.measured})"
        chosen = a.for_measured
        if chosen is None:
            return (
                f"{v}: none of the options tried would tell {what} from none at {level} "
                f"({power}): the pairs scatter too much for this design"
            )
    else:
        what = (
            f"a gain as small as {a.effect:.0%} (the smallest worth telling, --effect; it "
            f"measured {a.measured})"
        )
        if a.current.meets_target:
            return (
                f"{v}: nothing to add: this sweep would already tell {what} from none at "
                f"{level} ({a.current.power:.0%} power)"
            )
        chosen = a.best
        if chosen is None:
            return (
                f"{v}: none of the options tried tells {what} from none at {level} "
                f"({power}): the pairs scatter too much for this design"
            )
    o = chosen.option
    return (
        f"{v}: to tell {what} from none at {level} ({power}), add {o.label} "
        f"({o.n_trials} trials, {o.cost_flops:.3g} FLOPs; {cost.describe(o.cost_flops)})"
    )
