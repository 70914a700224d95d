"""Successive halving for the tuning stage's search (`tune.method: halving`, docs/sweep-yaml.md,
"A cheaper search").

A full grid trains every rate to the search's budget B, though a fraction of B already shows
which rates are far from the optimum. Halving trains every rate to B / 2^(R-1) (rung 0),
keeps the best half of them (at least 3, the best rate and its best neighbours, so that the
kept rates are contiguous in the grid and a parabola fits the last rung), trains those to
twice that, and so on up to B. The optimum is read from the last rung as a grid's is from
its one (orchestrator/plan/tuning.py).

Every rung's point is an ordinary trial with its own id (its rate and its budget): a finished
one is never trained again, and a driver stopped between rungs resumes where it was, picking
the same rates from the same losses. Under a wsd schedule the work is shared: a rate's
trial at one rung runs the same steps as its trial at the next up to its own cooldown start
(same warm-up in steps, prefix-stable data: orchestrator/plan/branching.py), so it seeds that
next trial with its checkpoint there (train.branch_seeds) and the next trial trains only the
rest. A dropped rate's seed is removed once the search has ended (orchestrator/tuned_run.py):
nothing resumes from it. Without wsd every rung trains from step 0, and halving can cost
more than the grid: the dry-run says which.

Why not Ray Tune's SuccessiveHalving or ASHA: they stop Tune trials from their intermediate
reports inside one Tune run, while here every point must be a trial of the sweep (its id, its
MLflow run, skipped when done, shown by `status`, resumed by a new driver). So the rungs are
planned by the orchestrator, with the textbook rule (Jamieson & Talwalkar 2016) narrowed to a
window, since the rates lie on one axis.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from scalelab.jobs.config import BranchSeed
from scalelab.orchestrator.plan.branching import saving, shared_prefix
from scalelab.orchestrator.plan.expand import Trial, iter_trials
from scalelab.orchestrator.plan.search_points import SearchLoss, point_label, search_spec
from scalelab.orchestrator.plan.spec import SourceMap, SpecError, SweepSpec

LAST_RUNG_RATES = 3  # a parabola's points


@dataclass(frozen=True)
class RateGroup:
    """One variant at one search point: its trial of every rate (ascending) at every rung."""

    variant: str
    point: str
    rungs: tuple[tuple[Trial, ...], ...]

    def continued(self, rung: int, index: int) -> int | None:
        """Tokens the rate's trial at `rung` shares with its trial at the rung before (the
        earlier one's cooldown start); None: it trains from step 0."""
        if rung == 0:
            return None
        short, long = self.rungs[rung - 1][index], self.rungs[rung][index]
        step = shared_prefix(short, long)
        return None if step is None else step * short.job.train.global_batch_tokens


def kept(n: int) -> int:
    """How many of `n` rates the next rung trains: half, at least a parabola's three."""
    return max(LAST_RUNG_RATES, math.ceil(n / 2))


def rung_counts(rates: int, rungs: int) -> list[int]:
    """How many rates each rung trains, from all of them down by `kept`."""
    counts = [rates]
    while len(counts) < rungs:
        counts.append(kept(counts[-1]))
    return counts


def rung_budgets(final: int, batch: int, rungs: int) -> list[int]:
    """Each rung's tokens: the last `final`, each before it half the next, in whole batches."""
    return [max(batch, round(final / 2 ** (rungs - 1 - k) / batch) * batch) for k in range(rungs)]


def window(losses: list[float], keep: int) -> list[int]:
    """The `keep` contiguous indices grown from the best finite loss towards the lower of
    its neighbours, one at a time (all diverged: from the smallest rate)."""
    finite = [i for i, loss in enumerate(losses) if math.isfinite(loss)]
    best = min(finite, key=lambda i: losses[i]) if finite else 0
    low, high = best, best
    while high - low + 1 < min(keep, len(losses)):
        left = losses[low - 1] if low > 0 else None
        right = losses[high + 1] if high + 1 < len(losses) else None
        take_left = right is None or (left is not None and _worse(right, left))
        low, high = (low - 1, high) if take_left else (low, high + 1)
    return list(range(low, high + 1))


def _worse(a: float, b: float) -> bool:
    """a is a worse loss than b (NaN, a divergence, worse than anything)."""
    a = a if math.isfinite(a) else math.inf
    b = b if math.isfinite(b) else math.inf
    return a > b


def rate_groups(
    spec: SweepSpec, source: SourceMap, progress: Callable[[int], None] | None = None
) -> list[RateGroup]:
    """Every variant and search point with its trials at every rung (planned, not run)."""
    assert spec.tune is not None
    entries: list[Any] = list(spec.variants) if spec.variants else [None]
    groups = []
    for entry in entries:
        full = search_spec(spec)
        if entry is not None:
            full = full.model_copy(update={"variants": [entry]})
        by_point: dict[str, list[Trial]] = {}
        for t in iter_trials(full, source, progress):
            by_point.setdefault(point_label(t, spec), []).append(t)
        for point, trials in by_point.items():
            trials.sort(key=lambda t: t.job.train.lr)
            first = trials[0]
            if first.job.train.tokens is None:
                raise SpecError([
                    f"{source.path}: tune.method halving halves the search's train.tokens: "
                    "give the budget as train.tokens (not tokens_per_param or flops)"
                ])  # fmt: skip
            budgets = rung_budgets(
                first.job.train.tokens, first.job.train.global_batch_tokens, spec.tune.rungs
            )
            if len(set(budgets)) < len(budgets):
                raise SpecError([
                    f"{source.path}: tune.rungs {spec.tune.rungs} halves train.tokens "
                    f"{first.job.train.tokens} below one batch: fewer rungs or more tokens"
                ])  # fmt: skip
            at = {k: first.axes.get(k) for k in spec.tune.at}
            rates = [t.job.train.lr for t in trials]
            rungs = [_rung(spec, source, full, at, rates, b, progress) for b in budgets[:-1]]
            groups.append(RateGroup(first.variant, point, (*rungs, tuple(trials))))
    return groups


def _rung(
    spec: SweepSpec,
    source: SourceMap,
    full: SweepSpec,
    at: dict[str, Any],
    rates: list[float],
    tokens: int,
    progress: Callable[[int], None] | None,
) -> tuple[Trial, ...]:
    grid = {**{k: [v] for k, v in at.items()}, "train.lr": rates, "train.tokens": [tokens]}
    trials = iter_trials(full.model_copy(update={"grid": grid}), source, progress)
    return tuple(sorted(trials, key=lambda t: t.job.train.lr))


def search(
    spec: SweepSpec,
    source: SourceMap,
    loss: SearchLoss | None,
    progress: Callable[[int], None] | None = None,
) -> tuple[list[Trial], list[Trial] | None]:
    """The search's trials known so far (each group's rungs up to the first that has not
    ended; `loss` None: rung 0 only) and the last rung's trials, None until every group's
    has been reached and ended."""
    known: list[Trial] = []
    last: list[Trial] = []
    complete = True
    for group in rate_groups(spec, source, progress):
        indices = list(range(len(group.rungs[0])))
        for k, rung in enumerate(group.rungs):
            known.extend(_seeding(group, k, i) for i in indices)
            losses = None if loss is None else [loss(rung[i].trial_id) for i in indices]
            if losses is None or any(v is None for v in losses):
                complete = False
                break
            if k == len(group.rungs) - 1:
                last.extend(rung[i] for i in indices)
                break
            kept_at = window([float(v) for v in losses], kept(len(indices)))  # type: ignore[arg-type]
            indices = [indices[j] for j in kept_at]
    return known, (last if complete else None)


def _seeding(group: RateGroup, rung: int, index: int) -> Trial:
    """The rate's trial at `rung`, carrying a seed for its trial at the next rung when the
    two share their first steps."""
    trial = group.rungs[rung][index]
    if rung + 1 >= len(group.rungs):
        return trial
    nxt = group.rungs[rung + 1][index]
    step = shared_prefix(trial, nxt)
    if step is None:
        return trial
    seeds = (*trial.job.train.branch_seeds, BranchSeed(step=step, trial_id=nxt.trial_id))
    train = trial.job.train.model_copy(update={"branch_seeds": seeds})
    return dataclasses.replace(trial, job=trial.job.model_copy(update={"train": train}))


@dataclass(frozen=True)
class SearchCost:
    """The search's training FLOPs by successive halving and as a full grid at its budget."""

    halving: float
    grid: float
    budgets: tuple[int, ...]  # the first group's tokens per rung
    counts: tuple[int, ...]  # rates per group at each rung
    shared: bool  # every rung continues from the one before

    @property
    def saved_fraction(self) -> float:
        return 1 - self.halving / self.grid if self.grid else 0.0


def planned_cost(groups: list[RateGroup]) -> SearchCost:
    """What halving will spend: every rung's count of rates (which rates is decided as it
    runs, the FLOPs are not), each continuing trial only past its shared steps."""
    halving = grid = 0.0
    shared = True
    counts = rung_counts(len(groups[0].rungs[0]), len(groups[0].rungs)) if groups else []
    for group in groups:
        grid += sum(t.flops for t in group.rungs[-1])
        for k, (rung, n) in enumerate(zip(group.rungs, counts, strict=True)):
            carried = group.continued(k, 0)
            shared = shared and (k == 0 or carried is not None)
            halving += n * (rung[0].flops - rung[0].flops / rung[0].tokens * (carried or 0))
    budgets = tuple(r[0].tokens for r in groups[0].rungs) if groups else ()
    return SearchCost(halving, grid, budgets, tuple(counts), shared)


def plan_line(cost: SearchCost) -> str:
    """The dry-run's line on the halving search."""
    tokens = " / ".join(f"{b:,}" for b in cost.budgets)
    counts = " -> ".join(str(c) for c in cost.counts)
    how = (
        "each kept rate resumes from its last rung's checkpoint"
        if cost.shared
        else "each rung trains from step 0 (only a wsd schedule with warmup_steps shares them)"
    )
    verdict = (
        f"{cost.saved_fraction:.0%} less" if cost.saved_fraction >= 0
        else f"{-cost.saved_fraction:.0%} more"
    )  # fmt: skip
    return (
        f"lr search by successive halving: {len(cost.counts)} rungs of {tokens} tokens, "
        f"{counts} rates per variant and point ({how}); {cost.halving:.3e} FLOPs against "
        f"{cost.grid:.3e} for the full grid ({verdict}). Listed: rung 0; the later rungs' "
        "rates are picked from its losses"
    )


def spent_line(groups: list[RateGroup], trials: list[Trial]) -> str:
    """The end of a submit's line on what the halving search's trials spent (each less the
    steps it resumed from a seed: branching.saving) against a full grid."""
    spent, grid = saving(trials, ran=True).spent, planned_cost(groups).grid
    verdict = f"{1 - spent / grid:.0%} less" if spent <= grid else f"{spent / grid - 1:.0%} more"
    return (
        f"tuning: the lr search by successive halving spent {spent:.3e} training FLOPs in "
        f"{len(trials)} trials, against {grid:.3e} for the full grid ({verdict})"
    )
