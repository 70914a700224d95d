"""A trunk seeds its cooldown branches (orchestrator/plan/branching.py; docs/architecture.md,
'Cooldown branches').

At a branch's cooldown start the trunk's complete checkpoint is copied into the branch's
own `trials/<id>/ckpt/`, with the loop state it holds less the trunk's MLflow run id and
plus where it came from (`branched_from`), and its curve up to that position into the
branch's `curves.jsonl`. The branch then resumes there as from its own checkpoint, and its
run gets the curve's points as a resumed run does (jobs/tracking/tracker.py). The copy is
made under a name no resume looks at and renamed into place last, so a kill leaves either
a whole seed or none; a branch that holds a checkpoint or a result already is not touched
(it was seeded, or has trained past its seed).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from scalelab.contract.workdir import CURVES_FILE, RESULT_FILE, trial_dir
from scalelab.jobs.config import BranchSeed
from scalelab.jobs.training import checkpoint

BRANCHED_FROM = "branched_from"  # loop-state key: {"trial_id": trunk, "step": seed step}


def seed(tag_dir: Path, trunk_id: str, branch: BranchSeed) -> bool:
    """Seed `branch` from the trunk's complete checkpoint `tag_dir`; False: it needed none."""
    dest = trial_dir(branch.trial_id)
    ckpt = dest / "ckpt"
    if (dest / RESULT_FILE).exists() or checkpoint.complete_checkpoints(ckpt):
        return False
    marker = checkpoint.read_marker(tag_dir)
    state: dict[str, Any] = {k: v for k, v in marker.state.items() if k != "run_id"}
    state[BRANCHED_FROM] = {"trial_id": trunk_id, "step": branch.step}
    ckpt.mkdir(parents=True, exist_ok=True)
    tmp = ckpt / f".seed-{tag_dir.name}"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(tag_dir, tmp, ignore=shutil.ignore_patterns(checkpoint.MARKER))
    (tmp / checkpoint.MARKER).write_text(
        marker.model_copy(update={"state": state}).model_dump_json()
    )
    points = _curve(tag_dir.parent.parent / CURVES_FILE, state["tokens"])
    curves = dest / (CURVES_FILE + ".tmp")
    curves.write_text("".join(json.dumps(p) + "\n" for p in points))
    curves.replace(dest / CURVES_FILE)
    tmp.rename(ckpt / tag_dir.name)
    return True


def _curve(path: Path, up_to_tokens: int) -> list[dict[str, Any]]:
    points = []
    for line in path.read_text().splitlines() if path.exists() else ():
        try:
            point = json.loads(line)
        except json.JSONDecodeError:  # a line torn by a kill
            continue
        if point["tokens"] <= up_to_tokens:
            points.append(point)
    return points
