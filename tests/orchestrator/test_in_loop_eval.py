"""`eval.in_loop`: a multiple-choice task scored at every validation while a trial trains
(real DeepSpeed, real lm-eval, real MLflow): its accuracy and correct-answer bits per byte
are curves on the run at the validation steps, the last point is what `scalelab eval`
gives on the same items of the trained model, and the results tables carry both."""

from __future__ import annotations

import json

import pytest
from conftest import sweep_yaml
from typer.testing import CliRunner

from scalelab.cli.main import app
from scalelab.orchestrator.ledger import Ledger

runner = CliRunner()
ITEMS = 16
PREFIX = "downstream/scalelab_zen"


def _sweep(name: str) -> str:
    backend = "{concurrency: 1, cpus_per_trial: 1, retry_backoff_s: 0.1}"
    text = sweep_yaml(name, seeds=1, first_seed=8700, backend=backend)
    text = text.replace("global_batch_tokens: 512}", "global_batch_tokens: 512, eval_interval: 2}")
    step = f"  eval: {{in_loop: {{tasks: [scalelab_zen], items: {ITEMS}}}}}\n"
    return text.replace("grid:", step + "grid:")


@pytest.mark.slow
def test_task_curves_during_training_match_the_trained_models_eval(
    tmp_path, ray_session, work_home, sweep_name
):
    from mlflow import MlflowClient

    from scalelab.contract.workdir import tracking_uri

    path = tmp_path / "sweep.yaml"
    path.write_text(_sweep(sweep_name))
    result = runner.invoke(app, ["submit", str(path)])
    assert result.exit_code == 0, result.output
    [(trial_id, record)] = Ledger(sweep_name).records().items()
    assert record.status == "FINISHED"
    client = MlflowClient(tracking_uri())
    curves = {
        what: [
            (m.step, m.value) for m in client.get_metric_history(record.run_id, f"{PREFIX}_{what}")
        ]
        for what in ("acc", "acc_norm", "bpb")
    }
    for points in curves.values():
        assert [s for s, _ in sorted(points)] == [2, 4, 6, 8]  # 8 steps, eval_interval 2
    assert all(0 <= v <= 1 for s, v in curves["acc"] + curves["acc_norm"])
    bpb = [v for _, v in sorted(curves["bpb"])]
    assert bpb[-1] < bpb[0] < 9  # an untrained byte model is near 8 bits a byte; it learns

    # the trained model's own evaluation, on the same first ITEMS questions
    evaluated = runner.invoke(
        app, ["eval", trial_id, "--tasks", "scalelab_zen", "--limit", str(ITEMS)]
    )
    assert evaluated.exit_code == 0, evaluated.output
    scores = client.get_run(record.run_id).data.metrics
    assert scores["eval/scalelab_zen/acc"] == pytest.approx(sorted(curves["acc"])[-1][1])
    assert scores["eval/scalelab_zen/acc_norm"] == pytest.approx(sorted(curves["acc_norm"])[-1][1])

    synced = runner.invoke(app, ["results", "sync", sweep_name])
    assert synced.exit_code == 0, synced.output
    rows = json.loads(
        runner.invoke(
            app, ["results", "query", sweep_name, "--columns",
                  "downstream_scalelab_zen_acc,downstream_scalelab_zen_bpb", "-f", "json"],
        ).stdout
    )  # fmt: skip
    assert rows == [
        {
            "downstream_scalelab_zen_acc": pytest.approx(sorted(curves["acc"])[-1][1]),
            "downstream_scalelab_zen_bpb": pytest.approx(bpb[-1]),
        }
    ]
    points = json.loads(
        runner.invoke(
            app, ["results", "query", sweep_name, "--table", "curves", "-m", f"{PREFIX}_bpb",
                  "-f", "json"],
        ).stdout
    )  # fmt: skip
    assert sorted((p["step"], p["value"]) for p in points) == pytest.approx(sorted(curves["bpb"]))
    assert all(p["flops"] > 0 for p in points)  # task curves vs compute, not only steps
