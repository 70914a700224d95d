"""A training job killed with SIGKILL and resumed: the steps it replays after its newest
checkpoint (or from the start, when it had none) reach MLflow and curves.jsonl once."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from faults.mlflow_kit import curve_points, env, mlflow_points, repeated, tiny_job

from scalelab.contract.runs import Metric

STEPS = 12


def _last_step(curves: Path) -> int:
    steps = [0]
    for line in curves.read_text().splitlines() if curves.exists() else []:
        try:
            steps.append(json.loads(line)["step"])
        except json.JSONDecodeError:  # being written
            pass
    return max(steps)


def _freeze_past_checkpoint(proc: subprocess.Popen, curves: Path, every: int) -> int:
    """SIGSTOP the job at a logged step >= 4 that is not a checkpoint step; returns it."""
    deadline = time.time() + 240
    while time.time() < deadline:
        if _last_step(curves) >= 4:
            proc.send_signal(signal.SIGSTOP)
            time.sleep(0.2)  # a line being written is finished by now
            last = _last_step(curves)
            if last % every and last < STEPS:
                return last
            proc.send_signal(signal.SIGCONT)
        assert proc.poll() is None, "the job ended before it could be killed"
        time.sleep(0.01)
    raise AssertionError("the job logged no step >= 4 in time")


def _wait_sent(uri: str, run_id: str, step: int) -> None:
    """Until MLflow holds train/loss at `step` (the sender runs while the job is frozen)."""
    deadline = time.time() + 120
    while time.time() < deadline:
        if step in {s for s, _ in mlflow_points(uri, run_id).get("train/loss", [])}:
            return
        time.sleep(0.2)
    raise AssertionError(f"train/loss at step {step} never reached MLflow")


@pytest.mark.slow
@pytest.mark.parametrize("checkpoint_every", [3, 1000], ids=["after-checkpoint", "no-checkpoint"])
def test_replayed_steps_reach_mlflow_and_the_curve_once(tmp_path, checkpoint_every, empty_store):
    from mlflow import MlflowClient

    home = tmp_path / "home"
    uri = empty_store(tmp_path / "mlflow.db")
    client = MlflowClient(uri)
    run_id = client.create_run(client.create_experiment("replay")).info.run_id
    job = tiny_job(train__checkpoint_interval=checkpoint_every)
    config = tmp_path / "job.json"
    config.write_text(job.model_dump_json())
    cmd = [sys.executable, "-m", "scalelab.jobs.training.train", str(config), run_id]
    curves = home / "trials" / job.trial_id / "curves.jsonl"

    first = subprocess.Popen(cmd, env=env(home, uri), stdout=subprocess.DEVNULL,
                             stderr=open(tmp_path / "first.err", "w"))  # fmt: skip
    try:
        killed_at = _freeze_past_checkpoint(first, curves, checkpoint_every)
        _wait_sent(uri, run_id, killed_at)  # so the resumed job replays steps MLflow has
    finally:
        first.kill()  # SIGKILL: no checkpoint, no goodbye
        first.wait()
    resumed = subprocess.run(cmd, env=env(home, uri), capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    result = json.loads(resumed.stdout.strip().splitlines()[-1])
    assert result["status"] == "FINISHED"

    curve: dict[str, list[tuple[int, float]]] = {}
    for p in curve_points(home, job.trial_id):
        curve.setdefault(p["metric"], []).append((p["step"], p["value"]))
    sent = mlflow_points(uri, run_id)
    assert sorted(curve) == sorted(sent)
    for name, points in curve.items():
        assert repeated(points) == [], f"curves.jsonl repeats {name} at steps {repeated(points)}"
        if name == Metric.VAL_LOSS_AT_GFLOP:  # its step is int(GFLOPs): tiny runs share step 0
            assert len(sent[name]) == len(points) == STEPS // 4
            continue
        assert repeated(sent[name]) == [], f"MLflow repeats {name} at {repeated(sent[name])}"
        assert [s for s, _ in sent[name]] == [s for s, _ in sorted(points)]
    assert [s for s, _ in curve["train/loss"]] == list(range(1, STEPS + 1))
    # a bit-exact resume: the replayed values are the ones MLflow kept from the first run
    assert sent["train/loss"] == sorted(curve["train/loss"])
    assert sent["val/loss"][-1] == (STEPS, result["final_val_loss"])
    assert client.get_run(run_id).info.status == "FINISHED"
