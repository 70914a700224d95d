"""`results compare`: a downstream accuracy column of the trials table against the baseline,
paired by cell and seed (analysis/results/compare.py), read back through the CLI from the
results store."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest
from scipy import stats
from typer.testing import CliRunner

from scalelab.analysis.results import tables
from scalelab.analysis.results.compare import compare_table
from scalelab.cli.main import app

SIZES = {"micro": 1.0e6, "mini": 4.0e6}
SEEDS = (0, 1, 2)


def _trials(rng: np.random.Generator) -> tuple[pa.Table, np.ndarray]:
    """dense and hadamard at two sizes, three seeds; a seed's data order moves both arms'
    accuracy (what pairing cancels); rows shuffled so that pairs are found by their keys."""
    rows, diffs = [], []
    for size, n in SIZES.items():
        for seed in SEEDS:
            shared = 0.5 + 0.1 * (n > 2e6) + rng.normal(0, 0.05)
            gap = rng.normal(0.01, 0.004)
            diffs.append(gap)
            for variant, acc in (("dense", shared), ("hadamard", shared + gap)):
                rows.append({"trial_id": f"{variant}-{size}-{seed}", "status": "FINISHED",
                             "variant": variant, "size": size, "seed": seed, "n_params": n,
                             "tokens": 20 * n, "flops": 120 * n * n, "eval_piqa_acc": acc})  # fmt: skip
    rows.append({**rows[0], "trial_id": "running", "status": "RUNNING", "eval_piqa_acc": None})
    order = rng.permutation(len(rows))
    return pa.Table.from_pylist([rows[i] for i in order]), np.array(diffs)


def test_a_metric_is_compared_pair_by_pair_with_a_t_interval():
    table, diffs = _trials(np.random.default_rng(3))
    out = compare_table(table, "s", "eval_piqa_acc")
    (overall,) = out.overall
    want = stats.ttest_1samp(diffs, 0.0).confidence_interval(0.95)
    assert overall.n_pairs == 6 and overall.n_cells == 2
    assert overall.mean == pytest.approx(diffs.mean(), abs=1e-12)
    assert (overall.low, overall.high) == pytest.approx((want.low, want.high), abs=1e-12)
    per_size = {dict(c.cell)["size"]: c for c in out.cells}
    assert set(per_size) == set(SIZES)
    assert per_size["micro"].loss_diff == pytest.approx(diffs[:3].mean(), abs=1e-12)
    assert per_size["micro"].loss_diff_se == pytest.approx(stats.sem(diffs[:3]), abs=1e-12)
    assert any("not FINISHED" in n for n in out.notes)


def test_the_cli_reads_the_store_and_names_the_eval_columns_it_has(tmp_path, monkeypatch):
    monkeypatch.setenv("SCALELAB_HOME", str(tmp_path))
    table, diffs = _trials(np.random.default_rng(5))
    tables.write_table(tables.TRIALS, "evals", table)
    shown = CliRunner().invoke(
        app, ["results", "compare", "evals", "-m", "eval_piqa_acc", "--json"]
    )
    assert shown.exit_code == 0, shown.output
    (overall,) = json.loads(shown.stdout)["overall"]
    assert overall["variant"] == "hadamard" and overall["mean"] == pytest.approx(diffs.mean())
    unknown = CliRunner().invoke(app, ["results", "compare", "evals", "-m", "eval_piqa"])
    assert unknown.exit_code == 2 and "eval_piqa_acc" in unknown.output
