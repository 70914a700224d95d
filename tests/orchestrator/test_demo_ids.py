"""The demo's trial ids are pinned: a change that moves them must be deliberate (a new
identity rule, with `scalelab migrate`), never a side effect of a refactoring."""

import json
from pathlib import Path

from scalelab.orchestrator.plan.spec import load_spec
from scalelab.orchestrator.plan.tuning import expand_sweep as expand

ROOT = Path(__file__).resolve().parents[2]
PINNED = Path(__file__).parent / "data" / "demo_ids.json"


def test_demo_trial_ids_are_pinned():
    trials = expand(*load_spec(ROOT / "sweeps" / "demo.yaml"))
    ids = {f"{t.variant} {t.size} {t.job.train.tokens}": t.trial_id for t in trials}
    assert ids == json.loads(PINNED.read_text())


def test_an_expansions_ids_are_its_jobs_own_in_every_shipped_sweep(monkeypatch):
    """`expand` works each shared config section's part of the ids out once per sweep
    (jobs/identity.py, `memo`): its trials and their ids are those of an expansion that
    works every trial's id out alone."""
    from scalelab.jobs import identity

    swept = {
        p.name: expand(*load_spec(p), max_trials=None) for p in (ROOT / "sweeps").glob("*.yaml")
    }
    alone = identity.trial_id
    monkeypatch.setattr(identity, "trial_id", lambda job, memo=None: alone(job))
    for name, trials in swept.items():
        again = expand(*load_spec(ROOT / "sweeps" / name), max_trials=None)
        assert [t.trial_id for t in trials] == [t.trial_id for t in again], name
        assert all(t.trial_id == t.job.trial_id for t in trials), name
