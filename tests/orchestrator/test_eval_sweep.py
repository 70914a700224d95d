"""`scalelab eval SWEEP` on a real trained sweep (real training, lm-eval, MLflow, Ray), as
after `scalelab submit` and `results sync`: the trial's run keeps its training's times (the
evaluation's own time is a metric of its own), the command prints each trial's scores, and
the results tables read them without another `results sync`."""

from __future__ import annotations

import json
import re
import uuid

import pytest
from conftest import sweep_yaml
from typer.testing import CliRunner

from scalelab.cli.main import app
from scalelab.orchestrator.ledger import Ledger

runner = CliRunner()
ACC = "eval/scalelab_zen/acc"


def _record(sweep: str):
    (rec,) = Ledger(sweep).records().values()
    return rec


def _wall_time(sweep: str) -> float:
    query = ["results", "query", sweep, "--format", "json", "--columns", "trial_id,wall_time_s"]
    shown = runner.invoke(app, query)
    assert shown.exit_code == 0, shown.output
    (row,) = json.loads(shown.stdout)
    return row["wall_time_s"]


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory, ray_session, work_home):
    """One trained trial (a seed no other test trains), its results synced, then `eval`
    of its sweep: (sweep, the record and wall time before, the eval's output)."""
    name = f"eval-sweep-{uuid.uuid4().hex[:6]}"
    path = tmp_path_factory.mktemp("eval-sweep") / "sweep.yaml"
    backend = "{concurrency: 1, cpus_per_trial: 1, retry_backoff_s: 0.1}"
    path.write_text(sweep_yaml(name, seeds=1, first_seed=8300, backend=backend))
    trained = runner.invoke(app, ["submit", str(path), "--no-summary"])
    assert trained.exit_code == 0 and "1 finished" in trained.output, trained.output
    synced = runner.invoke(app, ["results", "sync", name])
    assert synced.exit_code == 0, synced.output
    before, wall = _record(name), _wall_time(name)
    ran = runner.invoke(app, ["eval", name, "--tasks", "scalelab_zen", "--limit", "4"])
    assert ran.exit_code == 0, ran.output
    return name, before, wall, ran.output


def test_eval_of_a_sweep_keeps_each_trials_training_times(evaluated):
    name, before, wall, _ = evaluated
    after = _record(name)
    assert ACC in after.metrics and after.status == "FINISHED"
    assert (after.start_time, after.end_time) == (before.start_time, before.end_time)
    assert after.metrics["eval/scalelab_zen/wall_s"] > 0  # the evaluation's own time
    assert _wall_time(name) == wall


def test_eval_of_a_sweep_prints_each_trials_scores(evaluated):
    name, _, _, output = evaluated
    rec = _record(name)
    line = next((x for x in output.splitlines() if "scalelab_zen: acc " in x), None)
    assert line is not None and rec.name in line, output
    shown = dict(re.findall(r"(acc|acc_norm) (\d\.\d{4})", line))
    assert float(shown["acc"]) == pytest.approx(rec.metrics[ACC], abs=5e-5)
    assert float(shown["acc_norm"]) == pytest.approx(
        rec.metrics["eval/scalelab_zen/acc_norm"], abs=5e-5
    )
    assert "val loss" not in output  # the training's line is not the evaluation's
    again = runner.invoke(app, ["eval", name, "--tasks", "scalelab_zen", "--limit", "4"])
    assert again.exit_code == 0 and "1 skipped" in again.output, again.output
    held = [x for x in again.output.splitlines() if rec.name in x and " scored " in x]
    assert len(held) == 1 and f"acc {shown['acc']}" in held[0], again.output


def test_results_read_a_sweeps_new_scores_without_another_sync(evaluated):
    name, *_ = evaluated
    query = ["results", "query", name, "--format", "json", "--columns"]
    shown = runner.invoke(app, [*query, "trial_id,eval_scalelab_zen_acc"])
    assert shown.exit_code == 0, shown.output
    (row,) = json.loads(shown.stdout)
    assert row["eval_scalelab_zen_acc"] == _record(name).metrics[ACC]


@pytest.mark.parametrize(
    "args, says",
    [
        (["--tasks", "0"], "unknown task"),
        (["--tasks", "scalelab_zen", "--device", "1e30"], "--device '1e30'"),
        (["--tasks", "scalelab_zen,no_such_task_anywhere"], "no_such_task_anywhere"),
    ],
)
def test_eval_of_a_sweep_checks_its_arguments_before_anything_starts(evaluated, args, says):
    """As `eval TRIAL` does: one line, exit 2, no job started and the runs untouched (was:
    a Ray cluster and a failing job per finished trial, still running after 300 s)."""
    name, *_ = evaluated
    before = _record(name)
    refused = runner.invoke(app, ["eval", name, *args])
    assert refused.exit_code == 2, refused.output
    assert len(refused.stderr.strip().splitlines()) == 1 and says in refused.stderr
    assert "Traceback" not in refused.output and "finished" not in refused.stdout
    after = _record(name)
    assert (after.status, after.end_time, after.metrics) == (
        before.status, before.end_time, before.metrics
    )  # fmt: skip
