"""The tuning stage's search as a sweep of its own, and where each of its trials sits (`tune:`,
orchestrator/plan/tuning.py; a halving search's rungs, orchestrator/plan/halving.py)."""

from __future__ import annotations

from collections.abc import Callable

from scalelab.orchestrator.plan.expand import Trial
from scalelab.orchestrator.plan.spec import SweepSpec

# a search trial's loss: a float (NaN: it diverged), None while it has not ended
SearchLoss = Callable[[str], float | None]


def search_spec(spec: SweepSpec) -> SweepSpec:
    """The search as a sweep of its own: the variants at every rate where `tune.at` says."""
    assert spec.tune is not None
    grid = {**spec.tune.at, "train.lr": list(spec.tune.lr)}
    return spec.model_copy(update={"grid": grid, "zip": {}, "isoflop": None, "tune": None})


def point_label(trial: Trial, spec: SweepSpec) -> str:
    """A search trial's point: its values of `tune.at`'s keys ("nano"; "" with no `at`)."""
    assert spec.tune is not None
    return ", ".join(str(trial.axes.get(k)) for k in spec.tune.at)
