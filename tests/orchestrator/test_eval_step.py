"""A sweep's `eval.downstream` step (real training, real lm-eval, real MLflow, a real
driver killed with SIGKILL): a trial is evaluated on the shipped task after it trains; a
driver killed during the evaluation leaves it FINISHED without scores; the resubmit
evaluates it without training it again, and the next submit evaluates nothing; `eval
SWEEP` scores another task through the scheduler; a second sweep sharing the trial evaluates
it on its own run, which gets the training's curve, without training it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import sweep_yaml
from typer.testing import CliRunner

from scalelab.cli.main import app
from scalelab.jobs.downstream.tasks import SHIPPED
from scalelab.orchestrator.ledger import Ledger

runner = CliRunner()
ACC = "eval/scalelab_zen/acc"


def _sweep(name: str) -> str:
    """conftest's tiny sweep, one trial, with an eval.downstream step in its base."""
    backend = "{concurrency: 1, cpus_per_trial: 1, retry_backoff_s: 0.1}"
    step = "  eval: {downstream: {tasks: [scalelab_zen], limit: 4, batch_size: 8}}\n"
    return sweep_yaml(name, seeds=1, first_seed=8100, backend=backend).replace(
        "grid:", step + "grid:"
    )


def _evaluating(home: Path) -> str | None:
    """The trial whose log says its eval.downstream step started, with no scores yet."""
    for log in (home / "trials").glob("*/logs/*"):
        text = log.read_text(errors="replace")
        if "eval.downstream:" in text and "eval scalelab_zen:" not in text:
            return log.parts[-3]
    return None


@pytest.mark.slow
def test_a_driver_killed_mid_evaluation_resubmits_to_one_score(
    tmp_path, ray_session, work_home, sweep_name
):
    from mlflow import MlflowClient

    from scalelab.contract.workdir import tracking_uri

    path = tmp_path / "sweep.yaml"
    path.write_text(_sweep(sweep_name))
    log = tmp_path / "driver.log"
    with log.open("wb") as out:
        driver = subprocess.Popen(
            [sys.executable, "-m", "scalelab.cli.main", "submit", str(path)],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    deadline, killed = time.monotonic() + 300, None
    while killed is None:
        assert driver.poll() is None, log.read_text(errors="replace")[-3000:]
        assert time.monotonic() < deadline, "the trial's evaluation never started"
        time.sleep(0.1)
        killed = _evaluating(work_home)
    os.killpg(driver.pid, signal.SIGKILL)
    driver.wait()

    before = _records(sweep_name)
    assert before[killed].status == "FINISHED" and ACC not in before[killed].metrics
    result = (work_home / "trials" / killed / "result.json").read_text()

    again = runner.invoke(app, ["submit", str(path)])
    assert again.exit_code == 0, again.output
    after = _records(sweep_name)
    assert {t: r.run_id for t, r in after.items()} == {t: r.run_id for t, r in before.items()}
    assert (work_home / "trials" / killed / "result.json").read_text() == result  # not retrained
    client = MlflowClient(tracking_uri())
    for rec in after.values():
        assert rec.status == "FINISHED"
        (point,) = client.get_metric_history(rec.run_id, ACC)  # evaluated once
        saved = client.download_artifacts(rec.run_id, "eval/scalelab_zen.json", str(tmp_path))
        assert json.loads(Path(saved).read_text())["results"]["scalelab_zen"]["acc,none"] == (
            point.value
        )
    last = runner.invoke(app, ["submit", str(path)])
    assert last.exit_code == 0 and "1 skipped" in last.output, last.output
    assert len(client.get_metric_history(after[killed].run_id, ACC)) == 1

    # `scalelab eval SWEEP`: another task on every finished trial, through the scheduler
    task = tmp_path / "zen_again.yaml"
    text = (
        (SHIPPED / "scalelab_zen.yaml").read_text().replace("task: scalelab_zen", "task: zen_again")
    )
    task.write_text(text.replace("test: zen.jsonl", f"test: {SHIPPED / 'zen.jsonl'}"))
    evaluated = runner.invoke(app, ["eval", sweep_name, "--tasks", str(task), "--limit", "4"])
    assert evaluated.exit_code == 0 and "1 finished" in evaluated.output, evaluated.output
    assert len(client.get_metric_history(after[killed].run_id, "eval/zen_again/acc")) == 1
    again = runner.invoke(app, ["eval", sweep_name, "--tasks", str(task), "--limit", "4"])
    assert again.exit_code == 0 and "1 skipped" in again.output, again.output

    # another sweep with the same trial: not trained again, evaluated on its own run, and
    # its run gets the training's curve as any sweep sharing a trained trial does
    other = tmp_path / "other.yaml"
    other.write_text(_sweep(f"{sweep_name}-b"))
    shared = runner.invoke(app, ["submit", str(other)])
    assert shared.exit_code == 0 and "trained before in another sweep" in shared.output
    mine, theirs = after[killed].run_id, _records(f"{sweep_name}-b")[killed]
    assert theirs.status == "FINISHED" and theirs.tags["scalelab.trained_in_run"] == mine
    assert len(client.get_metric_history(theirs.run_id, ACC)) == 1
    curve = [(m.step, m.value) for m in client.get_metric_history(mine, "train/loss")]
    assert [(m.step, m.value) for m in client.get_metric_history(theirs.run_id, "train/loss")] == (
        curve
    )
    assert (work_home / "trials" / killed / "result.json").read_text() == result


def _records(sweep: str) -> dict:
    ledger = Ledger(sweep)
    return ledger.records() if ledger.experiment_id() is not None else {}
