"""The demo's trial ids are pinned: a change that moves them must be deliberate (a new
identity rule, with `scalelab migrate`), never a side effect of a refactoring."""

import json
from pathlib import Path

from scalelab.orchestrator.expand import expand
from scalelab.orchestrator.spec import load_spec

ROOT = Path(__file__).resolve().parents[2]
PINNED = Path(__file__).parent / "data" / "demo_ids.json"


def test_demo_trial_ids_are_pinned():
    trials = expand(*load_spec(ROOT / "sweeps" / "demo.yaml"))
    ids = {f"{t.variant} {t.size} {t.job.train.tokens}": t.trial_id for t in trials}
    assert ids == json.loads(PINNED.read_text())
