"""Cooldown branches of wsd trials (docs/architecture.md, 'Cooldown branches').

Trials of a sweep whose schedule is wsd and that differ only in their token budget (same
identity otherwise, same warm-up in steps, no mechanism that schedules by training
progress) train the same steps up to each one's cooldown start: the same learning rate
(jobs/schedule.py) on the same data (the prefix-stable order, jobs/data/reader.py). So the
group's longest trial is its trunk: it trains as it would alone, and at the cooldown start
of each shorter trial its checkpoint and its curve so far seed that trial's folder
(train.branch_seeds, jobs/training/branch_seed.py). The shorter trial then resumes there
as from its own checkpoint and trains only its cooldown: one trial with its own id, run,
curve and result, the same numbers as alone. The scheduler holds a branch until its seed
is written (or its trunk can no longer write it: then it trains alone, from step 0).
`train.branch: false` keeps a trial out of every group.
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scalelab.jobs.config import BranchSeed, JobConfig
from scalelab.jobs.identity import canonical_json
from scalelab.jobs.schedule import cooldown_start, warmup_steps

if TYPE_CHECKING:
    from scalelab.orchestrator.plan.expand import Trial

BUDGET_KEYS = ("tokens", "tokens_per_param", "flops")


@dataclass(frozen=True)
class Branch:
    trial_id: str
    trunk_id: str
    step: int  # its cooldown start: where the trunk's checkpoint seeds it
    steps: int  # its length


def _steps(trial: Trial) -> int:
    return max(1, math.ceil(trial.tokens / trial.job.train.global_batch_tokens))


def _reads_progress(trial: Trial) -> bool:
    """A component of the model reads the training progress (step / steps: a mechanism's
    schedule, `Component.reads_training_progress`): trials of different lengths differ
    from the first step, before any cooldown."""
    return any(c.reads_training_progress for c in trial.job.model.components)


def _group_key(trial: Trial) -> str | None:
    job, t = trial.job, trial.job.train
    if t.schedule != "wsd" or not t.branch or _reads_progress(trial):
        return None
    tree = job.identity_tree()
    train = {k: v for k, v in tree.get("train", {}).items() if k not in BUDGET_KEYS}
    return canonical_json({**tree, "train": train, "_warmup": warmup_steps(_steps(trial), t)})


def shared_prefix(short: Trial, long: Trial) -> int | None:
    """The steps `long` trains exactly as `short` does (short's cooldown start) when both are
    wsd trials of one group and `short` is shorter; None when they share none."""
    key = _group_key(short)
    if key is None or key != _group_key(long) or _steps(short) >= _steps(long):
        return None
    start = cooldown_start(_steps(short), short.job.train)
    return start if start > 0 else None


def branches(trials: list[Trial] | tuple[Trial, ...]) -> dict[str, Branch]:
    """The branches of the sweep by trial id: each wsd trial shorter than its group's
    longest whose cooldown starts after step 0."""
    groups: dict[str, list[Trial]] = defaultdict(list)
    for trial in trials:
        key = _group_key(trial)
        if key is not None:
            groups[key].append(trial)
    out: dict[str, Branch] = {}
    for members in groups.values():
        members = sorted(members, key=lambda t: (_steps(t), t.trial_id))
        trunk = members[-1]
        for trial in members[:-1]:
            steps = _steps(trial)
            start = cooldown_start(steps, trial.job.train)
            if 0 < start <= cooldown_start(_steps(trunk), trunk.job.train):
                out[trial.trial_id] = Branch(trial.trial_id, trunk.trial_id, start, steps)
    return out


def with_trunks(trials: list[Trial]) -> list[Trial]:
    """The trials, each trunk's job carrying its branches' seeds (train.branch_seeds:
    placement, its id unchanged)."""
    seeds: dict[str, list[BranchSeed]] = defaultdict(list)
    for b in branches(trials).values():
        seeds[b.trunk_id].append(BranchSeed(step=b.step, trial_id=b.trial_id))
    out = []
    for trial in trials:
        given = trial.job.train.branch_seeds  # a halving search's (orchestrator/plan/halving.py)
        mine = tuple(
            sorted({*seeds.get(trial.trial_id, ()), *given}, key=lambda s: (s.step, s.trial_id))
        )
        if mine != trial.job.train.branch_seeds:
            trial = dataclasses.replace(trial, job=_seeded(trial.job, mine))
        out.append(trial)
    return out


def _seeded(job: JobConfig, seeds: tuple[BranchSeed, ...]) -> JobConfig:
    train = job.train.model_copy(update={"branch_seeds": seeds})
    return job.model_copy(update={"train": train})


@dataclass(frozen=True)
class Saving:
    """Training compute of the sweep's trials: as independent runs, and as spent with
    branches (each branch trains only its cooldown)."""

    independent: float
    spent: float
    trunks: int
    branches: int

    @property
    def saved_fraction(self) -> float:
        return 1 - self.spent / self.independent if self.independent else 0.0


def saving(trials: list[Trial] | tuple[Trial, ...], ran: bool = False) -> Saving:
    """The plan's count; `ran`: after a run, only the branches that did start from their
    seed (the others trained alone: their whole compute)."""
    found = branches(trials)
    if ran:  # a branch that was seeded, or that seeded a longer trial (a halving search's)
        sources = {branched_from(t.trial_id) for t in trials}
        found = {tid: b for tid, b in found.items() if branched(tid) or tid in sources}
    spent = 0.0
    for t in trials:
        b = found.get(t.trial_id)
        spent += t.flops if b is None else t.flops * (b.steps - b.step) / b.steps
    trunks = len({b.trunk_id for b in found.values()})
    return Saving(sum(t.flops for t in trials), spent, trunks, len(found))


def seeded(trial_dir: Path, branch: Branch) -> bool:
    """The branch's folder holds a checkpoint (its seed, or its own) or its result."""
    from scalelab.contract.workdir import RESULT_FILE

    if (trial_dir / RESULT_FILE).exists():
        return True
    ckpt = trial_dir / "ckpt"
    return ckpt.exists() and any(ckpt.glob("step*/COMPLETE"))


def branched(trial_id: str) -> bool:
    """The trial's newest checkpoint descends from a trunk's seed (jobs/training/branch_seed.py)."""
    return branched_from(trial_id) is not None


def branched_from(trial_id: str) -> str | None:
    """The trial whose seed the trial's newest checkpoint descends from; None: its own."""
    import json

    from scalelab.contract.workdir import trial_dir

    found = sorted((trial_dir(trial_id) / "ckpt").glob("step*/COMPLETE"))
    if not found:
        return None
    try:
        source = json.loads(found[-1].read_text()).get("state", {}).get("branched_from")
    except (OSError, ValueError):
        return None
    return source.get("trial_id") if isinstance(source, dict) else None


def ran_line(trials: list[Trial] | tuple[Trial, ...]) -> str | None:
    """After a run, what the cooldown branches saved (None without branches)."""
    if not branches(trials):
        return None
    s = saving(trials, ran=True)
    return (
        f"cooldown branches: {s.branches} trial(s) shared their steps before the cooldown "
        f"with {s.trunks} longer one(s): {s.spent:.3e} training FLOPs for {s.independent:.3e} of trials "
        f"({s.saved_fraction:.0%} saved)"
    )


def plan_line(
    trials: list[Trial], hours_per_flop: float, unit: str
) -> tuple[str | None, dict[str, Any] | None]:
    """The dry-run plan's line on the sweep's cooldown branches: training compute spent (a
    branch only its cooldown) against independent runs, and the hours saved; with the same
    in numbers for --json. (None, None) without branches."""
    found = branches(trials)
    if not found:
        return None, None
    s = saving(trials)
    saved_h = (s.independent - s.spent) * hours_per_flop
    line = (
        f"cooldown branches: {s.branches} wsd trial(s) branch off {s.trunks} trunk(s); training "
        f"compute spent {s.spent:.3e} FLOPs instead of {s.independent:.3e} as independent runs "
        f"({s.saved_fraction:.0%} saved, ~{saved_h:.3g} {unit}-hours)"
    )
    numbers = {
        "trunks": s.trunks, "branches": {b.trial_id: {"trunk": b.trunk_id, "step": b.step}
                                         for b in found.values()},
        "flops_independent": s.independent, "flops_spent": s.spent,
        "saved_fraction": s.saved_fraction, f"{unit.lower()}_hours_saved": saved_h,
    }  # fmt: skip
    return line, numbers
