"""`results import`: a ladder measured elsewhere, with no MLflow behind it, answers every
`results` command (issue 28); its checks name the file's line; the compute-optimal
allocation, --where, the Huber delta, the holdout by compute and IsoFLOP bins."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

import scalelab
from scalelab.analysis.results import ResultsError, tables
from scalelab.analysis.results.imports import import_file
from scalelab.analysis.scaling import ChinchillaFit, bootstrap, fit_chinchilla

# Hoffmann et al.'s constants (their Approach 3)
TRUTH = ChinchillaFit(E=1.69, A=406.4, B=410.7, alpha=0.34, beta=0.28, n_trials=0)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A work directory with no MLflow database: nothing to sync from."""
    monkeypatch.setenv("SCALELAB_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return tmp_path / "home"


def _ladder_csv(path: Path) -> Path:
    """A ladder drawn from TRUTH (4 sizes, 3 token budgets, 2 seeds; hadamard as if it
    trained on 1/0.9 the tokens), as another framework would export it."""
    rng = np.random.default_rng(3)
    rows = []
    for n in (1e7, 4e7, 1.6e8, 6.4e8):
        for d in (2e8, 1e9, 5e9):
            for seed in (0, 1):
                for variant, m in (("dense", 1.0), ("hadamard", 0.9)):
                    loss = TRUTH.predict(n, d / m) * np.exp(rng.normal(0, 0.005))
                    rows.append({"N": int(n), "tokens": int(d), "loss": float(loss),
                                 "group": variant, "seed": seed})  # fmt: skip
    pcsv.write_csv(pa.Table.from_pylist(rows), path)
    return path


def _run(*args: str) -> str:
    from scalelab.cli.main import app

    res = CliRunner().invoke(app, ["results", *args])
    assert res.exit_code == 0, (args, res.output)
    return res.output


def test_import_fit_forecast_advise_report_without_mlflow(home: Path, tmp_path: Path):
    csv = _ladder_csv(tmp_path / "ladder.csv")
    out = _run("import", str(csv), "--sweep", "pub")
    assert "imported 48 trials" in out
    out = _run("import", str(csv), "--sweep", "pub")  # again: replaces, never duplicates
    assert "replacing its 48 previously imported rows" in out
    assert tables.read_table(tables.TRIALS, "pub").num_rows == 48
    fit = json.loads(_run("fit", "pub", "--json", "--resamples", "20", "--budget", "1e21,1e22"))
    assert fit["variants"] == ["dense", "hadamard"] and fit["n_used"] == 48
    assert {(a["variant"], a["flops"]) for a in fit["allocation"]} == {
        (v, c) for v in ("dense", "hadamard") for c in (1e21, 1e22)
    }
    for a in fit["allocation"]:
        n = a["n_opt"]
        assert n["low"] <= n["estimate"] <= n["high"]
    [gain] = [g for g in fit["paired_gains"] if g["variant"] == "hadamard"]
    assert gain["multiplier"]["high"] < 1
    held = json.loads(_run("forecast", "pub", "--holdout-above-flops", "1e18", "--json"))
    assert held["holdout"] == "runs above 1e+18 FLOPs" and held["targets"]
    assert all(t["flops"] > 1e18 and t["actual"] is not None for t in held["targets"])
    [advice] = json.loads(_run("advise", "pub", "--json"))
    assert advice["variant"] == "hadamard"
    # the notebook API: no sync to fail for want of MLflow
    assert scalelab.results("pub").num_rows == 48
    assert scalelab.forecast("pub", flops=1e21).predictions[0].loss > TRUTH.E
    # trials written without curves (by hand, as in issue 28): the plots draw what there is
    shutil.rmtree(tables.partition_dir(tables.CURVES, "pub"))
    where = "variant == 'dense'"
    printed = _run("report", "pub", "--resamples", "10", "--where", where).splitlines()
    report = Path(printed[0].removeprefix("report: "))
    page = report.with_suffix(".html")  # the same page, plots embedded, named beside it
    assert printed[1] == f"report: {page} (open in a browser)" and page.exists()
    text = report.read_text()
    assert f"Trials filtered by `{where}`" in text and "Compute-optimal allocation" in text
    trials = text.split("## Trials", 1)[1].split("##", 1)[0]
    assert trials.count("ladder.csv:") == 24 and "hadamard" not in trials  # by file line
    assert "MLflow" not in text  # there is none
    assert (report.parent / "plots" / "loss_vs_params.png").exists()
    assert not (home / "mlflow.db").exists()


def test_import_errors_name_the_line_and_write_nothing(home: Path, tmp_path: Path):
    bad = tmp_path / "bad.csv"
    bad.write_text("N,tokens,loss\n1e8,2e9,3.1\n\n1e8,abc,3.0\n2e8,2e9,-1\n3e8,1e9,\n")
    with pytest.raises(ResultsError) as e:
        import_file(bad, "bad")
    assert str(e.value).splitlines()[1:] == [
        f"{bad}:4: D 'abc' is not a number",
        f"{bad}:5: loss -1.0: expected a positive finite number",
        f"{bad}:6: loss is missing",
    ]
    assert tables.read_table(tables.TRIALS, "bad") is None
    bad.write_text("N,tokens,loss\n1e8,2e9,3.1\n1e8,2e9\n")
    with pytest.raises(ResultsError, match=f"{bad}:3: 2 fields where the header has 3"):
        import_file(bad, "bad")
    lines = tmp_path / "bad.jsonl"
    lines.write_text('{"N": 1e8, "C": 1e18, "loss": 3.1}\n\n{"N": 1e8, "C": 1e18, "loss": "x"}\n')
    with pytest.raises(ResultsError, match=f"{lines}:3: loss 'x' is not a number"):
        import_file(lines, "bad")
    table = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"params": [1e8, 2e8], "flops": [1e18, 1e18], "loss": [3.0, 0.0]}),
                   table)  # fmt: skip
    with pytest.raises(ResultsError, match=f"{table}:row 2: loss 0.0: expected a positive"):
        import_file(table, "bad")
    with pytest.raises(ResultsError, match="no column for loss"):
        pq.write_table(pa.table({"N": [1e8], "D": [1e9]}), table)
        import_file(table, "bad")
    from scalelab.cli.main import app

    res = CliRunner().invoke(app, ["results", "import", str(lines), "--sweep", "bad"])
    assert res.exit_code == 2 and f"{lines}:3:" in res.output and "Traceback" not in res.output


def _chinchilla_grid(rng: np.random.Generator, sd: float = 0.005) -> tuple[np.ndarray, ...]:
    n, d = (a.ravel() for a in np.meshgrid(np.geomspace(1e7, 1e9, 5), np.geomspace(2e8, 2e10, 5)))
    return n, d, TRUTH.predict(n, d) * np.exp(rng.normal(0, sd, n.size))


def test_allocation_covers_the_known_laws_optimum_and_the_huber_delta_matters():
    from scalelab.analysis.results.allocation import allocate

    n, d, y = _chinchilla_grid(np.random.default_rng(0))
    law = bootstrap(fit_chinchilla, n, d, y, n_resamples=60, seed=1)
    for a in allocate("dense", law, (1e21, 1e22)):
        n_true, d_true = (float(x) for x in TRUTH.optimal(a.flops))
        assert n_true in a.n_opt and d_true in a.d_opt
        assert d_true / n_true in a.tokens_per_param
        assert a.n_opt.low < a.n_opt.estimate < a.n_opt.high
        assert a.metrics()[f"optimal/dense/C_{a.flops:.3g}".replace("+", "") + "/N"] > 0
    y_off = y.copy()
    y_off[:3] *= 1.3  # three off-law points at the smallest D
    robust = fit_chinchilla(n, d, y_off)
    squares = fit_chinchilla(n, d, y_off, delta=1.0)  # Huber this wide is least squares
    assert abs(robust.beta - TRUTH.beta) < abs(squares.beta - TRUTH.beta)


def test_isoflop_fits_bin_real_flops_into_budgets():
    from scalelab.analysis.results.fit import fit_table
    from scalelab.analysis.scaling.isoflop import bin_budgets

    rng = np.random.default_rng(2)
    rows = []
    for c in (1e18, 1e19, 1e20):
        for n in np.geomspace(c**0.5 / 30, c**0.5 / 3, 5):
            d = c / (6 * n) * rng.uniform(0.95, 1.05)  # runs land near, not on, the budget
            loss = float(TRUTH.predict(n, d))
            rows.append({"trial_id": f"t{len(rows)}", "variant": "dense", "size": f"{n:.3g}",
                         "status": "FINISHED", "n_params": round(n), "tokens": round(d),
                         "flops": 6 * n * d, "final_val_loss": loss, "seed": 0})  # fmt: skip
    table = pa.Table.from_pylist(rows)
    budgets = bin_budgets(table["flops"].to_numpy(), 0.1)
    assert np.unique(budgets).size == 3 and np.allclose(np.sort(np.unique(budgets)),
                                                        [1e18, 1e19, 1e20], rtol=0.05)  # fmt: skip
    plain = fit_table(table, "iso", resample=False)
    assert not plain.isoflop  # no nominal budgets
    binned = fit_table(table, "iso", resample=False, isoflop_bin_width=0.1)
    iso = binned.isoflop["dense"]
    assert len(iso.budgets) == 3
    for o in iso.budgets:
        n_true = float(TRUTH.optimal(o.flops)[0])
        assert 0.6 < o.n_opt / n_true < 1.6  # a parabola's vertex through 5 sizes
