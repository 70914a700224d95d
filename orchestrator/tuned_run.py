"""A sweep with `tune:` run in its two stages (orchestrator/plan/tuning.py): the search's
trials first (a halving search's one rung at a time, orchestrator/plan/halving.py), then,
once each has ended, the sweep expanded again from their losses and run whole (the
search's trials skipped as FINISHED). A driver stopped at any point resumes from what the
trial folders hold: the same losses give the same rates, the same trial ids. Once the
search has ended, the seeds a halving rung wrote for the rates the next rung dropped are
removed: nothing resumes from them, and each is a whole checkpoint (weights and optimizer).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import fields

from scalelab.contract import workdir
from scalelab.contract.runs import Tag
from scalelab.orchestrator.ledger import Ledger
from scalelab.orchestrator.plan.branching import branched_from
from scalelab.orchestrator.plan.expand import Trial
from scalelab.orchestrator.plan.tuning import BOTH, PENDING, TUNE
from scalelab.orchestrator.scheduler import SweepOutcome, close_sweep

# runs some trials as one stage of the sweep; `close`: the last stage
RunStage = Callable[[list[Trial], bool], SweepOutcome]


def pending(trials: list[Trial]) -> bool:
    return any(t.stage == PENDING for t in trials)


def run_tuned(
    trials: list[Trial],
    ledger: Ledger,
    run_stage: RunStage,
    expand_again: Callable[[], list[Trial]],
) -> tuple[list[Trial], SweepOutcome]:
    """The search (when the ladder still waits for it; a halving search rung by rung, each
    rung's rates picked from the one before), then the whole sweep at the tuned rates; the
    trials as run and what happened to them. When the search does not end (a trial
    cancelled, or failed without diverging) the ladder is left pending."""
    done: SweepOutcome | None = None
    while pending(trials):
        search = [t for t in trials if t.stage in (TUNE, BOTH)]
        ran = run_stage(search, False)
        done = ran if done is None else _merged(done, ran)
        trials = expand_again()
        grown = {t.trial_id for t in trials if t.stage in (TUNE, BOTH)} - {
            t.trial_id for t in search
        }
        if pending(trials) and not grown:  # nothing more to search: a trial did not end
            close_sweep(ledger, done)
            return trials, done
    _tag_stages(ledger, trials)
    discard_unused_seeds(trials)
    last = run_stage(trials, True)
    return trials, last if done is None else _merged(done, last)


def discard_unused_seeds(trials: list[Trial]) -> list[str]:
    """Remove the seeds written for trials the sweep no longer lists (a halving rung's, for
    the rates the next rung dropped); the ids removed. Only a folder that holds a seed and
    nothing of its own is touched: a trial that has started, or that another sweep trained,
    is left as it is."""
    listed = {t.trial_id for t in trials}
    unused = {s.trial_id for t in trials for s in t.job.train.branch_seeds} - listed
    return sorted(tid for tid in unused if _discard_seed(tid))


def _discard_seed(trial_id: str) -> bool:
    folder = workdir.trial_dir(trial_id)
    if not folder.is_dir() or {p.name for p in folder.iterdir()} - {"ckpt", workdir.CURVES_FILE}:
        return False  # absent, or it has run (a log, a result, a spool of its own)
    if branched_from(trial_id) is None:
        return False  # its newest checkpoint is its own, not a seed
    shutil.rmtree(folder)
    return True


def _tag_stages(ledger: Ledger, trials: list[Trial]) -> None:
    """A search trial the ladder also takes (the same computation) is tagged as both."""
    records = ledger.records()
    for t in trials:
        rec = records.get(t.trial_id)
        if rec is not None and t.stage and rec.tags.get(Tag.STAGE) != t.stage:
            ledger.set_tags(rec.run_id, {Tag.STAGE: t.stage})


def _merged(first: SweepOutcome, second: SweepOutcome) -> SweepOutcome:
    """Both stages' outcomes as one: a search trial the first stage ran is not counted
    again as skipped by the second."""
    ran = {
        tid for f in fields(SweepOutcome) for tid in getattr(first, f.name) if f.name != "skipped"
    }
    out = SweepOutcome()
    for f in fields(SweepOutcome):
        later = [tid for tid in getattr(second, f.name) if not (f.name == "skipped" and tid in ran)]
        setattr(out, f.name, list(dict.fromkeys(getattr(first, f.name) + later)))
    out.skipped = [tid for tid in out.skipped if tid not in ran]
    return out
