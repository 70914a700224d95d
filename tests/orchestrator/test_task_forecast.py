"""Forecasts of downstream accuracy (docs/evaluation.md, "Forecasting task accuracy"):
the two laws' 95% intervals cover a held-out largest size on synthetic ladders drawn from
each law; a ladder at chance is refused in one line; `results import` reads accuracy
columns; the command prints the forecast and its backtest; and on the published Pythia
suite the 12B model's accuracies fall inside the intervals forecast from 70M-6.9B."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import pytest
from typer.testing import CliRunner

from scalelab.analysis.results import ResultsError, tables
from scalelab.analysis.results.imports import import_file
from scalelab.analysis.results.task_forecast import task_forecast_table
from scalelab.analysis.scaling.task_laws import (
    TaskForecastError,
    _sigmoid,
    chance_refusal,
    fit_direct,
    fit_two_step,
)

N = 20e6 * 2.0 ** np.arange(8)  # 8 sizes, D = 20 N: C = 6 N D spans 4.2 decades
C = 6 * N * 20 * N
SIGMOID = (0.7, 0.25, 6.0, 1.2)  # a, b (chance 0.25), k, L0
STEP1 = (2.04, 0.04)  # log L = 2.04 - 0.04 log C: task loss 1.6 at 1e17 FLOPs, 1.1 at 8e20
ITEMS = 2000  # a task's questions: binomial noise, sd ~1.1% at 0.5
LOSS_NOISE = 0.01


def _two_step_ladder(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Each size at D = 20 N and at 1/2 and 1/4 of its tokens (earlier checkpoints, for
    step 2 only); task loss from STEP1 with 1% log-normal noise, accuracy a binomial draw
    from SIGMOID at that loss."""
    c = np.concatenate([C, C / 2, C / 4])
    loss = np.exp(STEP1[0] - STEP1[1] * np.log(c) + rng.normal(0, LOSS_NOISE, c.size))
    acc = rng.binomial(ITEMS, _sigmoid(loss, *SIGMOID)) / ITEMS
    return {"c": c, "loss": loss, "acc": acc, "size": np.tile(np.arange(8), 3),
            "ladder": np.arange(c.size) < 8}  # fmt: skip


def _direct_acc(rng: np.random.Generator) -> np.ndarray:
    """-log acc = A C^-alpha (0.35 at 1e17 FLOPs, 0.72 at 8e20), binomial draws."""
    truth = np.exp(-np.exp(np.log(1.05) - 0.117 * (np.log(C) - np.log(1e17))))
    return rng.binomial(ITEMS, truth) / ITEMS


def test_direct_interval_covers_the_held_out_largest_size_at_its_level():
    """600 ladders: the 7 smaller sizes forecast the largest (4x their compute)."""
    rng = np.random.default_rng(11)
    covered = []
    for r in range(600):
        acc = _direct_acc(rng)
        law = fit_direct(C[:7], acc[:7], n_resamples=200, seed=r)
        covered.append(acc[7] in law.predict(C[7:])[0])
    assert 0.90 <= np.mean(covered) <= 0.98, np.mean(covered)


def test_two_step_interval_covers_the_held_out_largest_size_at_its_level():
    """250 ladders; the chained forecast's interval (both steps' resampled refits, both
    scatters) covers the largest size's accuracy at about 95%, and its point is unbiased."""
    rng = np.random.default_rng(7)
    covered, errors = [], []
    for r in range(250):
        lad = _two_step_ladder(rng)
        fit = lad["size"] < 7
        s1 = fit & lad["ladder"]
        law = fit_two_step(lad["c"][s1], lad["loss"][s1], lad["loss"][fit], lad["acc"][fit],
                           chance=0.25, n_resamples=100, seed=r)  # fmt: skip
        p = law.predict([C[7]])[0]
        actual = lad["acc"][7]
        covered.append(actual in p)
        errors.append(p.acc - actual)
        assert p.low >= 0 and p.high <= 1 and law.constants["b"] >= 0.25
    assert 0.90 <= np.mean(covered) <= 0.98, np.mean(covered)
    assert abs(np.mean(errors)) < 0.01, np.mean(errors)


def _table_csv(path: Path, acc: np.ndarray, loss: np.ndarray | None, n: np.ndarray,
               d: np.ndarray, stderr: np.ndarray | None = None, task: str = "piqa") -> Path:  # fmt: skip
    cols = {"n_params": n.astype(int), "tokens": d.astype(int), f"acc_{task}": acc}
    if loss is not None:
        cols[f"eval_{task}_bpb"] = loss
    if stderr is not None:
        cols[f"eval_{task}_acc_stderr"] = stderr
    pcsv.write_csv(pa.table(cols), path)
    return path


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SCALELAB_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return tmp_path / "home"


def test_a_ladder_at_chance_is_refused_in_one_line(home: Path, tmp_path: Path):
    """PIQA at chance (0.5) at every size: no number comes back, only why."""
    rng = np.random.default_rng(0)
    acc = rng.binomial(ITEMS, 0.5, N.size) / ITEMS
    se = np.sqrt(acc * (1 - acc) / ITEMS)
    loss = np.exp(STEP1[0] - STEP1[1] * np.log(C))
    import_file(_table_csv(tmp_path / "flat.csv", acc, loss, N, 20 * N, se), "flat")
    table = tables.read_table(tables.TRIALS, "flat")
    with pytest.raises(ResultsError) as e:
        task_forecast_table(table, "flat", "eval_piqa_acc", holdout_params=N[-2])
    text = str(e.value)
    assert "\n" not in text and "at chance" in text and "no trend" in text
    # a ladder that rises above chance over its sizes is not refused
    assert chance_refusal(np.arange(8), _sigmoid(loss, 0.5, 0.5, 6.0, 1.2) + 0.0, se, 0.5) is None
    # without standard errors the sigmoid's lack of rise refuses two-step
    with pytest.raises(TaskForecastError, match="does not rise"):
        fit_two_step(C, loss, loss, acc, chance=0.5, n_resamples=20)


def test_import_reads_accuracy_columns(home: Path, tmp_path: Path):
    """acc_<task> and eval_<task>_<metric> columns become eval_<task>_<metric>, a file
    without a loss is imported when it has scores, and a bad score is refused at its line."""
    acc = np.linspace(0.55, 0.75, N.size)
    path = _table_csv(tmp_path / "acc.csv", acc, np.linspace(1.5, 1.1, N.size), N, 20 * N,
                      np.full(N.size, 0.01))  # fmt: skip
    result = import_file(path, "acc")
    table = tables.read_table(tables.TRIALS, "acc")
    assert {"eval_piqa_acc", "eval_piqa_bpb", "eval_piqa_acc_stderr"} <= set(table.column_names)
    assert np.allclose(table["eval_piqa_acc"].to_numpy(), np.sort(acc))
    assert result.ignored == ()
    bad = tmp_path / "bad.csv"
    bad.write_text("n_params,tokens,acc_piqa\n1000000,20000000,0.6\n2000000,40000000,1.3\n")
    with pytest.raises(
        ResultsError, match=r"bad.csv:3: eval_piqa_acc '?1.3'?: expected an accuracy"
    ):
        import_file(bad, "bad")
    twice = tmp_path / "twice.csv"
    twice.write_text("n_params,tokens,acc_piqa,eval_piqa_acc\n1000000,20000000,0.6,0.6\n")
    with pytest.raises(ResultsError, match="both mean eval_piqa_acc"):
        import_file(twice, "twice")


def test_the_command_prints_the_forecast_and_the_backtest(home: Path, tmp_path: Path):
    from scalelab.cli.main import app

    lad = _two_step_ladder(np.random.default_rng(4))
    n = np.sqrt(lad["c"] / 120)  # D = 20 N at every run (the checkpoints as smaller runs)
    path = _table_csv(tmp_path / "lad.csv", lad["acc"][lad["ladder"]],
                      lad["loss"][lad["ladder"]], n[lad["ladder"]],
                      20 * n[lad["ladder"]], task="hellaswag")  # fmt: skip
    import_file(path, "lad")
    args = ["results", "forecast", "lad", "--metric", "eval_hellaswag_acc",
            "--holdout-above-params", str(N[-2] * 1.01)]  # fmt: skip
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "two-step: L = exp(l0)" in res.output and "direct: -log acc" in res.output
    assert "backtest on 1.28B" in res.output and "inside the 95% interval" in res.output
    assert "correct-answer loss eval_hellaswag_bpb" in res.output
    out = json.loads(CliRunner().invoke(app, [*args, "--json"]).output)
    for m in out["methods"]:
        (target,) = m["targets"]
        assert target["low"] <= target["predicted"] <= target["high"]
        assert target["covered"] == (target["low"] <= target["actual"] <= target["high"])
        assert m["backtest"]["size"] == "1.28B"
    res = CliRunner().invoke(app, [*args, "--method", "nope"])
    assert res.exit_code == 2 and "--method" in res.output


def test_pythia_12b_falls_inside_the_forecast_from_the_smaller_sizes(pythia: pa.Table):
    """Fitted on 70M-6.9B (the checkpoints nearest 12B's 25 tokens per parameter), the
    12B model's final accuracies: measured all covered (docs/evaluation.md)."""
    for metric in ("eval_piqa_acc", "eval_lambada_openai_acc", "eval_mean_acc"):
        result = task_forecast_table(pythia, "pythia", metric, holdout="12B")
        for m in result.methods:
            if metric != "eval_lambada_openai_acc" and m.method == "two-step":
                assert m.refusal and "no intermediate loss" in m.refusal  # no val loss
                continue
            ((target, p),) = zip(result.targets, m.predictions, strict=True)
            assert target.actual in p, (metric, m.method, p, target.actual)
            assert p.high - p.low < 0.3
    with pytest.raises(ResultsError, match="at chance"):
        task_forecast_table(pythia, "pythia", "eval_arc_challenge_acc", holdout="12B")
