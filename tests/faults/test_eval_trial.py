"""`scalelab eval` on a real finished trial (the session's ZeRO-2 BudgetFormer trial, real
MLflow): the shipped local task's scores land on the trial's run (metrics and lm-eval's
JSON) and in the results tables; a second call is a no-op; missing task data is one line."""

import json
from pathlib import Path

from mlflow import MlflowClient
from typer.testing import CliRunner

from scalelab.cli.main import app

runner = CliRunner()


def test_eval_writes_scores_to_the_run_and_the_tables_once(trial_copy, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf"))
    trial_id = trial_copy.job.trial_id
    args = ["eval", trial_id[:8], "--tasks", "scalelab_zen", "--limit", "8"]
    first = runner.invoke(app, args)
    assert first.exit_code == 0, first.output
    assert "scalelab_zen: acc " in first.stdout and "budget_heads" in first.stdout

    client = MlflowClient()
    runs = client.search_runs(  # the shared store may hold a resumed copy's run too
        [e.experiment_id for e in client.search_experiments()],
        f"tags.`scalelab.trial_id` = '{trial_id}'",
    )
    (run,) = [r for r in runs if "eval/scalelab_zen/acc" in r.data.metrics]
    acc = run.data.metrics["eval/scalelab_zen/acc"]
    assert 0.0 <= acc <= 1.0 and "eval/scalelab_zen/acc_norm" in run.data.metrics
    assert 1.0 <= run.data.metrics["eval/scalelab_zen/budget_heads"] <= trial_copy.job.model.n_head
    path = client.download_artifacts(run.info.run_id, "eval/scalelab_zen.json", str(tmp_path))
    artifact = json.loads(Path(path).read_text())
    assert artifact["results"]["scalelab_zen"]["acc,none"] == acc
    assert artifact["scalelab"]["executed"]["mode"] == "inference"

    again = runner.invoke(app, args)
    assert again.exit_code == 0 and "scores already on run" in again.stdout, again.output
    assert len(client.get_metric_history(run.info.run_id, "eval/scalelab_zen/acc")) == 1

    query = ["results", "query", "tests-faults", "--format", "json", "--columns"]
    shown = runner.invoke(app, [*query, "trial_id,run_id,eval_scalelab_zen_acc"])
    assert shown.exit_code == 0, shown.output
    rows = {r["trial_id"]: r for r in json.loads(shown.stdout)}
    assert rows[trial_id]["eval_scalelab_zen_acc"] == acc  # eval and sync read one run
    assert rows[trial_id]["run_id"] == run.info.run_id


def test_lm_evals_own_api_takes_the_adapter_by_name(trial_copy, tmp_path, monkeypatch):
    import lm_eval
    from lm_eval.tasks import TaskManager

    import scalelab.jobs.downstream.adapter  # noqa: F401  registers "scalelab"
    from scalelab.jobs.downstream.tasks import SHIPPED, specs

    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf"))
    out = lm_eval.simple_evaluate(
        model="scalelab", model_args=f"trial={trial_copy.job.trial_id},mode=soft",
        tasks=specs(["scalelab_zen"]), limit=4, bootstrap_iters=0,
        task_manager=TaskManager(include_path=str(SHIPPED), include_defaults=False),
    )  # fmt: skip
    assert 0.0 <= out["results"]["scalelab_zen"]["acc,none"] <= 1.0


def test_eval_of_uncached_task_data_is_one_line(trial_copy, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf"))
    task = tmp_path / "hub_task.yaml"
    task.write_text(
        "task: hub_task\ndataset_path: scalelab-tests/not-cached\ntest_split: test\n"
        "output_type: multiple_choice\ndoc_to_text: q\ndoc_to_choice: c\ndoc_to_target: 0\n"
    )
    result = runner.invoke(app, ["eval", trial_copy.job.trial_id, "--tasks", str(task)])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "not cached" in lines[0] and "HF_DATASETS_CACHE" in lines[0], lines
    nothing = runner.invoke(app, ["eval", "no-such-name", "--tasks", "scalelab_zen"])
    assert nothing.exit_code == 2, nothing.output
    assert "no trial 'no-such-name'" in nothing.stderr and "no sweep is named" in nothing.stderr


def test_eval_of_one_trial_syncs_its_synced_tables(trial_copy, tmp_path, monkeypatch):
    """Scores written after a `results sync` are in the table at once (no sync between)."""
    import uuid

    from scalelab.jobs.downstream.tasks import SHIPPED

    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf"))
    name = f"zen_{uuid.uuid4().hex[:6]}"  # a task no other test scored on the shared run
    text = (
        (SHIPPED / "scalelab_zen.yaml").read_text().replace("task: scalelab_zen", f"task: {name}")
    )
    task = tmp_path / f"{name}.yaml"
    task.write_text(text.replace("test: zen.jsonl", f"test: {SHIPPED / 'zen.jsonl'}"))
    synced = runner.invoke(app, ["results", "sync", "tests-faults"])
    assert synced.exit_code == 0, synced.output
    trial_id = trial_copy.job.trial_id
    ran = runner.invoke(app, ["eval", trial_id[:8], "--tasks", str(task), "--limit", "4"])
    assert ran.exit_code == 0 and f"{name}: acc " in ran.stdout, ran.output
    query = ["results", "query", "tests-faults", "--format", "json", "--columns"]
    shown = runner.invoke(app, [*query, f"trial_id,eval_{name}_acc"])
    assert shown.exit_code == 0, shown.output
    rows = {r["trial_id"]: r for r in json.loads(shown.stdout)}
    assert 0.0 <= rows[trial_id][f"eval_{name}_acc"] <= 1.0
