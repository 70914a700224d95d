"""Training jobs on 2 gloo ranks, in one start of the ranks (tests/forked_ranks.py):
tests/jobs/dist_worker.py runs each (home, job) in turn on both ranks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from forked_ranks import on_ranks

WORKER = Path(__file__).with_name("jobs") / "dist_worker.py"


def train_on_two_ranks(runs: list[tuple[Path, Any]], tmp_path: Path) -> list[dict]:
    """Each run's result as rank 0 saw it (jobs.training.train's TrainResult as a dict)."""
    spec, out = tmp_path / "spec.json", tmp_path / "out.json"
    items = [{"home": str(home), "job": json.loads(job.model_dump_json())} for home, job in runs]
    spec.write_text(json.dumps({"runs": items, "out": str(out)}))
    on_ranks(WORKER, "train_runs", str(spec))
    return json.loads(out.read_text())
