"""`results compare` on a downstream accuracy says how many items each trial scored (from
lm-eval's binomial standard error), the task's chance level, and warns when item noise
dwarfs the paired interval or the accuracies sit at chance."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest
from typer.testing import CliRunner

from scalelab.analysis.results import tables
from scalelab.analysis.results.compare import compare_table, items_from_stderr
from scalelab.cli.main import app

SIZES = {"nano": 1.2e5, "tiny": 3.7e5}


def _lm_eval_stderr(correct: int, items: int) -> float:
    """lm-eval's acc_stderr: the sample standard deviation of the 0/1 scores over sqrt(n)."""
    scores = np.array([1.0] * correct + [0.0] * (items - correct))
    return float(scores.std(ddof=1) / np.sqrt(items))


def _trials(items: int, base: float, gap_sd: float, seed: int = 0) -> pa.Table:
    """dense and budget at two sizes, three seeds, each trial scored on the same `items`
    items: budget gets dense's count give or take gap_sd × items (what pairing sees)."""
    rng = np.random.default_rng(seed)
    rows = []
    for size, n in SIZES.items():
        for s in (0, 1, 2):
            dense = rng.binomial(items, base)
            budget = dense + round(rng.normal(0.0, gap_sd) * items) + (s == 0)
            for variant, k in (("dense", dense), ("budget", budget)):
                correct = int(np.clip(k, 1, items - 1))
                rows.append({"trial_id": f"{variant}-{size}-{s}", "status": "FINISHED",
                             "variant": variant, "size": size, "seed": s, "n_params": n,
                             "tokens": 32_768, "flops": 6 * n * 32_768,
                             "eval_scalelab_zen_acc": correct / items,
                             "eval_scalelab_zen_acc_stderr": _lm_eval_stderr(correct, items)})  # fmt: skip
    return pa.Table.from_pylist(rows)


def test_the_item_count_is_read_back_from_the_standard_error():
    acc = np.array([k / 8 for k in range(9)])
    se = np.array([_lm_eval_stderr(k, 8) for k in range(9)])
    n = items_from_stderr(acc, se)
    assert np.isnan(n[0]) and np.isnan(n[-1])  # all wrong or all right: it does not say
    assert np.all(n[1:-1] == 8)


def test_eight_items_near_chance_get_a_count_the_chance_level_and_a_warning():
    noise = compare_table(
        _trials(8, 0.27, 0.0), "s", "eval_scalelab_zen_acc", baseline="dense"
    ).noise
    assert noise.task == "scalelab_zen" and noise.items == 8 and noise.chance == 0.25
    assert noise.trial_se > 0.1
    assert "binomial standard error" in noise.warning and "chance (0.25)" in noise.warning
    assert "\n" not in noise.warning


def test_many_items_well_above_chance_need_no_warning():
    result = compare_table(
        _trials(20_000, 0.6, 0.02), "s", "eval_scalelab_zen_acc", baseline="dense"
    )
    assert result.noise.items == pytest.approx(20_000, rel=1e-3)
    (overall,) = result.overall
    assert result.noise.trial_se < (overall.high - overall.low) / 2
    assert result.noise.warning is None


def test_a_loss_or_an_accuracy_without_a_standard_error():
    table = _trials(8, 0.27, 0.0).drop_columns(["eval_scalelab_zen_acc_stderr"])
    noise = compare_table(table, "s", "eval_scalelab_zen_acc", baseline="dense").noise
    assert noise.items is None and noise.chance == 0.25 and "chance" in noise.warning
    loss = table.append_column("final_val_loss", pa.array(np.linspace(3, 4, table.num_rows)))
    assert compare_table(loss, "s", "final_val_loss", baseline="dense").noise is None


def test_the_cli_prints_the_items_the_chance_level_and_the_warning(tmp_path, monkeypatch):
    monkeypatch.setenv("SCALELAB_HOME", str(tmp_path))
    tables.write_table(tables.TRIALS, "zen", _trials(8, 0.27, 0.0))
    args = ["results", "compare", "zen", "-m", "eval_scalelab_zen_acc", "-b", "dense"]
    shown = CliRunner().invoke(app, args)
    assert shown.exit_code == 0, shown.output
    text = " ".join(shown.output.split())
    assert "scalelab_zen: 8 items per trial" in text and "chance 0.25" in text
    assert "warning: with 8 items" in text
    as_json = json.loads(CliRunner().invoke(app, [*args, "--json"]).stdout)
    assert as_json["noise"]["items"] == 8 and as_json["noise"]["chance"] == 0.25
