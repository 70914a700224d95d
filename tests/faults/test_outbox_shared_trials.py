"""Two runs recording one trial (two sweeps sharing it in one work directory): each run
holds the trial's whole curve, and the trial is trained once."""

from __future__ import annotations

import pytest
from faults.mlflow_kit import mlflow_points, scalelab, sweep_yaml

from scalelab.jobs.tracking.tracker import Tracker
from scalelab.orchestrator.ledger import Ledger


@pytest.mark.slow
def test_a_second_sweep_sharing_a_trial_gets_its_metrics_without_training_it(tmp_path, empty_store):
    home = tmp_path / "home"
    uri = empty_store(home / "mlflow.db")
    for name in ("first", "second"):
        (tmp_path / f"{name}.yaml").write_text(sweep_yaml(name, seeds=1))
    done = scalelab("submit", str(tmp_path / "first.yaml"), "--no-summary", home=home)
    assert done.returncode == 0, done.stderr[-3000:]
    ((trial_id, first),) = Ledger("first", tracking_uri=uri).records().items()
    trial_files = sorted(p for p in (home / "trials" / trial_id).rglob("*") if p.is_file())
    before = {p: p.read_bytes() for p in trial_files if "outbox" not in str(p)}

    again = scalelab("submit", str(tmp_path / "second.yaml"), "--no-summary", home=home)
    assert again.returncode == 0, again.stderr[-3000:]
    ledger = Ledger("second", tracking_uri=uri)
    second = ledger.records()[trial_id]
    assert second.run_id != first.run_id and second.status == "FINISHED"
    assert mlflow_points(uri, second.run_id) == mlflow_points(uri, first.run_id)
    assert len(mlflow_points(uri, second.run_id)["train/loss"]) == 12
    assert "1 finished (1 trained before in another sweep: metrics copied)" in again.stdout
    assert second.tags["scalelab.trained_in_run"] == first.run_id
    assert {p: p.read_bytes() for p in before} == before  # trained once: nothing rewritten


def test_a_run_that_continues_another_runs_training_gets_the_whole_curve(
    tmp_path, monkeypatch, empty_store
):
    """Trial half-trained under run A (preempted), finished under run B: B holds every
    point, A the ones logged under it."""
    from mlflow import MlflowClient

    uri = empty_store(tmp_path / "mlflow.db")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    client = MlflowClient(uri)
    exp = client.create_experiment("shared")
    run_a, run_b = (client.create_run(exp).info.run_id for _ in range(2))
    trial = tmp_path / "trial"

    first = Tracker(trial, enabled=True, flush_interval_s=0.1)
    first.start(run_a, "shared", "a", {}, {})
    for step in range(1, 6):
        first.log(step, step * 10, float(step), {"train/loss": 1.0 / step})
    assert first.finish(None) is True  # preempted: run A stays RUNNING

    second = Tracker(trial, enabled=True, flush_interval_s=0.1)
    second.start(run_b, "shared", "b", {}, {})
    for step in range(6, 11):
        second.log(step, step * 10, float(step), {"train/loss": 1.0 / step})
    assert second.finish("FINISHED") is True

    def steps(run_id: str) -> list[int]:
        return [s for s, _ in mlflow_points(uri, run_id)["train/loss"]]

    assert steps(run_b) == list(range(1, 11))
    assert steps(run_a) == list(range(1, 6))
    assert client.get_run(run_b).info.status == "FINISHED"
