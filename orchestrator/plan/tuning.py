"""A sweep's tuning stage (`tune:`, docs/sweep-yaml.md, "Tuning the learning rate").

A comparison at one shared learning rate can credit a variant with what is only its
distance from its own optimum. With `tune:` a sweep runs in two stages:

1. **the search** ("tune" trials): every variant at each rate of `tune.lr`, where `tune.at`
   says (a small width); each point an ordinary trial with its own identity, so a finished
   one is never trained again;
2. **the ladder** ("ladder" trials): the sweep's own trials, each variant at its own optimum
   (the vertex of a parabola in log-rate through its search, orchestrator/plan/lr_optimum.py,
   at the search point of largest compute), and with `compare_at_baseline_rate` every
   other variant also at the baseline's optimum, so the gain is known at both rates.

Until every search trial has ended, the ladder's trials are planned at base's rate and
marked "pending": the dry-run shows their compute (which the rate does not change), the
driver does not run them. The optimum is read again from the search's results at every
submit, so a driver stopped mid-search resumes it and decides the same way.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from scalelab.contract import workdir
from scalelab.contract.runs import Status
from scalelab.models.mechanism import DENSE
from scalelab.orchestrator.plan import halving
from scalelab.orchestrator.plan.branching import with_trunks
from scalelab.orchestrator.plan.expand import Trial, check_size, expand, iter_trials
from scalelab.orchestrator.plan.lr_optimum import (
    RateOptimum,
    rate_optimum,
    rounded,
    transfer_holds,
)
from scalelab.orchestrator.plan.search_points import SearchLoss, point_label, search_spec
from scalelab.orchestrator.plan.spec import DEFAULT_MAX_TRIALS, SourceMap, SweepSpec

TUNE, LADDER, PENDING = "tune", "ladder", "pending"
BOTH = "tune+ladder"  # a ladder trial that is also a search point (the same computation)


@dataclass(frozen=True)
class Tuning:
    """What the search found: every variant's optimum at each search point (the values of
    `tune.at`'s keys, e.g. "nano"), and the rate its ladder trials use."""

    optima: dict[str, dict[str, RateOptimum]]  # variant -> search point -> optimum
    rates: dict[str, float]  # variant -> its ladder rate (the largest point's, rounded)
    used: dict[str, str]  # variant -> the search point its rate comes from
    baseline: str
    grid: tuple[float, ...] = ()  # tune.lr: a halving search's last rung holds only some

    def lines(self, compared_at_baseline: bool) -> list[str]:
        """Each variant's optimum per search point and its rate, then the fairness checks."""
        out = []
        for variant, by_point in sorted(self.optima.items()):
            at = "; ".join(f"{o.rate_text()} at {p or 'base'}" for p, o in by_point.items())
            out.append(f"tuning: {variant}: lr {at} -> its trials at {self.rates[variant]:.3g}")
        for variant, by_point in sorted(self.optima.items()):
            for point, o in by_point.items():
                end = "largest" if o.best_rate == o.rates[-1] else "smallest"
                if o.at_edge and self.grid and o.best_rate not in (self.grid[0], self.grid[-1]):
                    out.append(
                        f"check: {variant}'s best rate at {point or 'base'} is the {end} that "
                        f"the halving kept ({o.best_rate:.1e}), not the grid's: the optimum "
                        "moved as the rungs grew longer; give the first rung more tokens "
                        "(fewer tune.rungs) or use method: grid"
                    )
                elif o.at_edge:
                    out.append(
                        f"check: {variant}'s best rate at {point or 'base'} is the grid's {end} "
                        f"({o.best_rate:.1e}): widen tune.lr"
                    )
                elif not o.fitted:
                    out.append(
                        f"check: {variant} at {point or 'base'}: no parabola through its best "
                        "rates (too noisy, or too few that did not diverge): its best grid point "
                        "is used"
                    )
            if len(by_point) > 1 and not transfer_holds(list(by_point.values())):
                moved = ", ".join(f"{p} {o.rate:.1e}" for p, o in by_point.items())
                out.append(
                    f"check: {variant}'s optimum moves with width beyond its interval or "
                    f"the grid's step ({moved}): the rate does not transfer here "
                    "(model.parametrization: mup is meant to make it)"
                )
        base_rate = self.rates.get(self.baseline)
        for variant, by_point in sorted(self.optima.items()):
            own = by_point[self.used[variant]]
            if not compared_at_baseline or variant == self.baseline or base_rate is None:
                continue
            if not (own.low <= base_rate <= own.high):
                out.append(
                    f"check: {variant} at {self.baseline}'s rate ({base_rate:.3g}) is off its own "
                    f"optimum ({own.rate_text()}): the gain at the shared rate is biased; read "
                    "the gain at its own rate"
                )
        return out


def ladder_spec(spec: SweepSpec, variant: str | None, rate: float | None) -> SweepSpec:
    """The sweep's own trials of one variant (None: base's model) at one rate (None: base's,
    the pending trials' placeholder)."""
    update: dict[str, Any] = {"tune": None}
    if rate is not None:
        update["base"] = {**spec.base, "train": {**spec.base.get("train", {}), "lr": rate}}
    if variant is not None:
        update["variants"] = [variant]
    return spec.model_copy(update=update)


def tuning(spec: SweepSpec, search: list[Trial], loss: SearchLoss) -> Tuning | None:
    """Each variant's optimum from its search trials' losses; None while one has not ended."""
    assert spec.tune is not None
    losses = {t.trial_id: loss(t.trial_id) for t in search}
    if any(v is None for v in losses.values()):
        return None
    points: dict[str, dict[str, list[Trial]]] = {}
    for t in search:
        points.setdefault(t.variant, {}).setdefault(point_label(t, spec), []).append(t)
    optima: dict[str, dict[str, RateOptimum]] = {}
    rates: dict[str, float] = {}
    used: dict[str, str] = {}
    for variant, by_point in points.items():
        optima[variant] = {}
        for label, trials in by_point.items():
            trials = sorted(trials, key=lambda t: t.job.train.lr)
            optima[variant][label] = rate_optimum(
                [t.job.train.lr for t in trials],
                [float(losses[t.trial_id]) for t in trials],  # type: ignore[arg-type]
            )
        used[variant] = max(by_point, key=lambda label: sum(t.flops for t in by_point[label]))
        rates[variant] = rounded(optima[variant][used[variant]].rate)
    return Tuning(optima, rates, used, spec.tune.baseline, tuple(spec.tune.lr))


def expand_sweep(
    spec: SweepSpec,
    source: SourceMap | None = None,
    max_trials: int | None = DEFAULT_MAX_TRIALS,
    progress: Callable[[int], None] | None = None,
    loss: SearchLoss | None = None,
) -> list[Trial]:
    """plan.expand's trials; for a sweep with `tune:` both stages' (`staged_trials`, the
    ladder's rates from the search's losses, `search_loss` unless `loss` is given)."""
    if spec.tune is None:
        return expand(spec, source, max_trials, progress)
    source = source or SourceMap("<sweep>", None)
    check_size(spec, source, max_trials)
    trials = staged_trials(spec, source, loss or search_loss, progress)
    return with_trunks(sorted(trials, key=lambda t: (t.flops, t.trial_id)))


def staged_trials(
    spec: SweepSpec,
    source: SourceMap,
    loss: SearchLoss | None,
    progress: Callable[[int], None] | None = None,
) -> list[Trial]:
    """The search's trials, then the ladder's at the tuned rates (or "pending" at base's
    rate before the search ended; `loss` None: not looked up). A trial both stages hold
    (the same computation) is in both ("tune+ladder")."""
    assert spec.tune is not None
    if spec.tune.method == "halving":  # rung by rung (orchestrator/plan/halving.py)
        known, last = halving.search(spec, source, loss, progress)
        search = [replace(t, stage=TUNE) for t in known]
        found = tuning(spec, last, loss) if last is not None and loss is not None else None
    else:
        search = [replace(t, stage=TUNE) for t in iter_trials(search_spec(spec), source, progress)]
        found = tuning(spec, search, loss) if loss is not None else None
    variants: list[str | None] = list(spec.variants) if spec.variants else [None]
    out = {t.trial_id: t for t in search}
    for variant in variants:
        name = variant or DENSE
        if found is None:
            rates, stage = [_placeholder_rate(spec)], PENDING
        else:
            rates, stage = [found.rates[name]], LADDER
            if spec.tune.compare_at_baseline_rate and name != spec.tune.baseline:
                rates.append(found.rates[spec.tune.baseline])
        for rate in rates:
            for t in iter_trials(ladder_spec(spec, variant, rate), source, progress):
                known = out.get(t.trial_id)
                if known is None:
                    out[t.trial_id] = replace(t, stage=stage)
                elif known.stage == TUNE and stage == LADDER:
                    out[t.trial_id] = replace(known, stage=BOTH)
    return list(out.values())


def _placeholder_rate(spec: SweepSpec) -> float:
    """The rate the ladder's pending trials are listed at: base's, unless the search trains
    it (a pending trial would then be a search trial's twin and not be listed, nor its
    ladder known to wait): then a hair off it, which no trial ever runs at."""
    from scalelab.jobs.config import TrainConfig

    assert spec.tune is not None
    rate = spec.base.get("train", {}).get("lr", TrainConfig.model_fields["lr"].default)
    return rate * (1 + 1e-6) if rate in spec.tune.lr else rate


def in_ladder(stage: str | None) -> bool:
    """A trial the sweep's comparison reads: a ladder trial, or one without a stage (a
    sweep with no `tune:`)."""
    return stage in (None, "", LADDER, BOTH)


def search_loss(trial_id: str) -> float | None:
    """A search trial's final validation loss from its result.json: NaN when it diverged
    (or finished without one), None while it has not ended (or failed otherwise: the
    ladder waits for it to be run again)."""
    try:
        result = json.loads((workdir.trial_dir(trial_id) / workdir.RESULT_FILE).read_text())
    except (OSError, ValueError):
        return None
    if result.get("status") == Status.FINISHED:
        loss = result.get("final_val_loss")
        return float(loss) if isinstance(loss, int | float) else math.nan
    return math.nan if result.get("diverged") else None


def tuning_text(spec: SweepSpec, trials: list[Trial], loss: SearchLoss) -> str | None:
    """What the search found, for the end of a submit: each variant's optimum at every
    search point with its interval and the rate its trials use, then the checks that say
    when the comparison is not fair (docs/results.md, "Fairness checks"); None without
    `tune:`."""
    if spec.tune is None:
        return None
    search = [t for t in trials if t.stage in (TUNE, BOTH)]
    cost = None
    if spec.tune.method == "halving":
        groups = halving.rate_groups(spec, SourceMap("<sweep>", None))
        last = {t.trial_id for g in groups for t in g.rungs[-1]}
        pending = any(t.stage == PENDING for t in trials)
        found = None if pending else tuning(spec, [t for t in search if t.trial_id in last], loss)
        cost = halving.spent_line(groups, search)
    else:
        found = tuning(spec, search, loss)
    if found is None:
        waiting = sum(loss(t.trial_id) is None for t in search)
        return (
            f"tuning: {waiting} of {len(search)} search trials have not ended (cancelled, or "
            "failed without diverging): the sweep's own trials wait for them; submit again"
        )
    lines = found.lines(spec.tune.compare_at_baseline_rate)
    return "\n".join(lines if cost is None else [cost, *lines])


def search_plan_line(spec: SweepSpec) -> str | None:
    """The dry-run's line on a halving search's rungs and compute against a full grid; None
    for a grid search (its trials are all listed) or without `tune:`."""
    if spec.tune is None or spec.tune.method != "halving":
        return None
    return halving.plan_line(
        halving.planned_cost(halving.rate_groups(spec, SourceMap("<sweep>", None)))
    )
