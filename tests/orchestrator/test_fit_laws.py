"""The fitter's law registry (analysis/results/laws): a law registered from outside
scalelab (tests/support/pure_power_law.py) is fitted to each variant and shows in `results
fit`'s tables, its --json and the report, with nothing in scalelab naming it; the built-in
laws keep their old names on SweepFit."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest
from pure_power_law import PurePowerLaw  # tests/support
from typer.testing import CliRunner

from scalelab.analysis.report import write_report
from scalelab.analysis.results import laws, tables
from scalelab.analysis.results.fit import fit_sweep
from scalelab.cli.main import app

A, ALPHA = 50.0, 0.1  # the synthetic sweep's law, L = A·C^-alpha (no irreducible loss)
SIZES = {"s1": 1e6, "s2": 3e6, "s3": 1e7, "s4": 3e7, "s5": 1e8}
SWEEP = "pure"


def _trials() -> pa.Table:
    """dense at five sizes, 20 tokens per parameter, two seeds, the loss on the law give or
    take 0.2% (no training: the table a sync would write)."""
    rng = np.random.default_rng(0)
    rows = []
    for size, n in SIZES.items():
        for seed in (0, 1):
            d = 20 * n
            loss = A * (6 * n * d) ** -ALPHA * np.exp(rng.normal(0.0, 0.002))
            config = {"model": {"size": size}, "train": {"tokens": int(d), "seed": seed}}
            rows.append({"trial_id": f"{size}-{seed}", "status": "FINISHED", "variant": "dense",
                         "size": size, "seed": seed, "n_params": int(n), "tokens": int(d),
                         "flops": 6 * n * d, "final_val_loss": float(loss),
                         "curves_source": "imported", "config": json.dumps(config)})  # fmt: skip
    return pa.Table.from_pylist(rows)


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("SCALELAB_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    tables.write_table(tables.TRIALS, SWEEP, _trials())
    return tmp_path


@pytest.fixture
def pure_law():
    law = laws.register(PurePowerLaw())
    yield law
    laws.unregister(law.name)


def _fit(*args: str) -> str:
    result = CliRunner().invoke(app, ["results", "fit", SWEEP, "--resamples", "10", *args])
    assert result.exit_code == 0, result.output
    return result.stdout


def test_a_registered_law_is_in_the_table_the_json_and_the_report(home, pure_law):
    table = _fit()
    assert pure_law.title in table
    row = next(line for line in table.splitlines()
               if line.startswith("│ dense") and "L = A·C^-alpha" in line)  # fmt: skip
    alpha = float(row.split("│")[4].split()[0])  # variant, law, A, alpha, trials
    assert alpha == pytest.approx(ALPHA, abs=0.003)

    fitted = json.loads(_fit("--json"))["pure_power_law"]["dense"]
    assert fitted["form"] == "L = A·C^-alpha" and fitted["n_trials"] == 2 * len(SIZES)
    alpha = fitted["constants"]["alpha"]
    assert alpha["low"] <= ALPHA <= alpha["high"] and alpha["high"] - alpha["low"] < 0.01
    assert alpha["estimate"] == pytest.approx(ALPHA, abs=0.003)
    assert fitted["constants"]["A"]["estimate"] == pytest.approx(A, rel=0.1)

    fit = fit_sweep(SWEEP, n_resamples=10)
    report = write_report(fit, {}, home / "report").read_text()
    assert f"## {pure_law.title}" in report
    assert f"- pure L(C) of dense: the loss falls {alpha['estimate']:.3f}% per 1%" in report
    # its forecast: a run ten times the largest's compute, inside the interval
    c = 10 * 6 * 1e8 * 20 * 1e8
    loss, low, high = fit.predict("pure_power_law", "dense", flops=c)
    assert low[0] < A * c**-ALPHA < high[0] and loss[0] == pytest.approx(A * c**-ALPHA, rel=0.01)


def test_the_built_in_laws_keep_their_names_and_an_unregistered_law_is_gone(home, pure_law):
    fit = fit_sweep(SWEEP, n_resamples=10)
    assert list(fit.law_fits) == ["power_law", "chinchilla", "isoflop", "pure_power_law"]
    assert fit.laws["dense"] is fit.law_fits["power_law"]["dense"].result
    assert fit.law_checks["dense"] is fit.law_fits["power_law"]["dense"].check
    assert set(fit.chinchilla) == {"dense"} and not fit.isoflop
    with pytest.raises(ValueError, match="registered already"):
        laws.register(PurePowerLaw())
    laws.unregister(pure_law.name)
    again = fit_sweep(SWEEP, n_resamples=10)
    assert "pure_power_law" not in again.law_fits and "pure_power_law" not in again.to_dict()
    assert pure_law.title not in _fit()


def test_a_law_that_skips_a_variant_says_why(home, pure_law):
    one_compute = _trials().filter(pa.array([s in ("s1", "s2") for s in SIZES for _ in (0, 1)]))
    tables.write_table(tables.TRIALS, SWEEP, one_compute)
    fit = fit_sweep(SWEEP, n_resamples=10)
    assert "pure L(C) of dense: needs 3 or more compute values" in fit.notes
    assert not fit.law_fits["pure_power_law"] and fit.laws  # L(C) still fits
