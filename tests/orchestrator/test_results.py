"""analysis.results: sync (real MLflow sqlite + trial files), incremental sync, queries,
and the fit through the whole sync -> fit path on data from a known law."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from mlflow import MlflowClient
from synthetic_sweep import write_sweep
from typer.testing import CliRunner

from scalelab.analysis.results import (
    ResultsError,
    load_curves,
    load_trials,
    metric_at,
    query,
    sync,
    tables,
)
from scalelab.analysis.results.fit import fit_sweep
from scalelab.analysis.results.query import ResultsWarning
from scalelab.contract import workdir

SIZES = ("nano", "micro", "mini", "124M")
HADAMARD_M = 0.8  # the known compute multiplier the fit must recover
STEPS = 10


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        root = tmp_path_factory.mktemp("scalelab")
        mp.setenv("SCALELAB_HOME", str(root))
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        trials = write_sweep(
            "main", sizes=SIZES, multipliers={"dense": 1.0, "hadamard": HADAMARD_M},
            steps=STEPS, noise=0.003,
        )  # fmt: skip
        yield {"root": root, "trials": trials, "synced": sync("main")}


def test_sync_writes_partitioned_zstd_tables_with_the_trials_values(home):
    trials, synced = home["trials"], home["synced"]
    assert synced.n_trials == len(trials) == 2 * len(SIZES) * 3
    files = list((home["root"] / "results" / "trials" / "sweep=main").glob("*.parquet"))
    assert files and synced.trials_path == files[0].parent
    meta = pq.ParquetFile(next(synced.curves_path.glob("*.parquet"))).metadata
    assert meta.row_group(0).column(0).compression == "ZSTD"
    table = load_trials("main")
    by_id = {r["trial_id"]: r for r in table.to_pylist()}
    for t in trials:
        row = by_id[t.trial_id]
        assert (row["variant"], row["size"], row["status"]) == (t.variant, t.size, "FINISHED")
        assert row["final_val_loss"] == pytest.approx(t.final_loss)
        assert row["flops"] == pytest.approx(t.flops) and row["n_params"] == t.n_params
        assert 0 < row["n_nonembed"] < row["n_params"]  # counted from job.json's model config
        assert row["curves_source"] == "local" and row["run_id"] == t.run_id
        assert json.loads(row["config"])["model"]["size"] == t.size
    curves = load_curves("main")
    assert curves.num_rows == len(trials) * STEPS * 4  # val/loss, train/loss, compute/*
    assert pa.types.is_dictionary(curves.schema.field("metric").type)
    assert set(curves["metric"].unique().cast(pa.string()).to_pylist()) == {
        "val/loss", "train/loss", "compute/flops", "compute/tokens"
    }  # fmt: skip


def test_row_groups_are_large(tmp_path):
    n = 300_000
    t = pa.table({"trial_id": ["a"] * n, "step": np.arange(n), "tokens": np.arange(n),
                  "flops": np.ones(n), "metric": ["m"] * n, "value": np.ones(n)})  # fmt: skip
    part = tables.write_table(tables.CURVES, "big", t.cast(tables.curves_schema()), tmp_path)
    meta = pq.ParquetFile(next(part.glob("*.parquet"))).metadata
    assert meta.num_rows == n and meta.num_row_groups == 1


def test_incremental_sync_does_not_reread_finished_trials(home, tmp_path, monkeypatch):
    before_trials, before_curves = load_trials("main"), load_curves("main")
    victim = home["trials"][0].trial_id
    tdir = workdir.trial_dir(victim)
    (tdir / workdir.CURVES_FILE).write_text(
        '{"step": 1, "tokens": 1, "flops": 1.0, "metric": "val/loss", "value": 99.0}\n'
    )
    (tdir / workdir.RESULT_FILE).unlink()
    again = sync("main")
    assert (again.n_read, again.n_reused) == (0, len(home["trials"]))
    assert load_trials("main").equals(before_trials)
    assert load_curves("main").equals(before_curves)


def test_rows_derived_by_other_code_are_all_read_again(home, monkeypatch):
    """After an upgrade that changes how rows are derived (FLOPs, parameter counts), a sync
    re-reads every finished trial instead of keeping rows the old code wrote."""
    import importlib

    sync_module = importlib.import_module("scalelab.analysis.results.sync")  # the package's `sync`
    write_sweep("upgrade", sizes=("nano",), multipliers={"dense": 1.0}, steps=3)
    first = sync("upgrade")
    assert (sync("upgrade").n_read, first.n_read) == (0, first.n_trials)
    monkeypatch.setattr(sync_module, "row_derivation", lambda: "the next release")
    upgraded = sync("upgrade")
    assert (upgraded.n_read, upgraded.n_reused) == (first.n_trials, 0)
    assert sync("upgrade").n_read == 0  # and the new rows are kept from then on


def test_running_trial_is_read_again_until_finished(home):
    client = MlflowClient(workdir.tracking_uri())
    [running] = write_sweep(
        "inc",
        sizes=("nano",),
        multipliers={"dense": 1.0},
        tokens_per_param=(20,),
        steps=5,
        status="RUNNING",
        seeds=(1,),
    )  # fmt: skip  (trial dirs are shared by content: keep apart from "main")
    first = sync("inc")
    assert first.n_read == 1 and load_trials("inc")["status"].to_pylist() == ["RUNNING"]
    # the job finishes: more points and its result land, the run turns FINISHED
    tdir = workdir.trial_dir(running.trial_id)
    with open(tdir / workdir.CURVES_FILE, "a") as f:
        f.write(
            json.dumps({"step": 6, "tokens": 7, "flops": 8.0, "metric": "val/loss", "value": 1.25})
            + "\n"
        )
    client.set_terminated(running.run_id, status="FINISHED")
    second = sync("inc")
    row = load_trials("inc").to_pylist()[0]
    assert second.n_read == 1 and row["status"] == "FINISHED" and row["final_val_loss"] == 1.25
    assert sync("inc").n_read == 0  # now finished: never read again


def test_curves_from_mlflow_when_no_local_files(home):
    trials = write_sweep("remote", sizes=("nano", "micro"), multipliers={"dense": 1.0},
                         tokens_per_param=(20,), steps=6, local_files=False, log_metrics=True,
                         seeds=(2,))  # fmt: skip
    sync("remote")
    rows = {r["trial_id"]: r for r in load_trials("remote").to_pylist()}
    curves = load_curves("remote")
    for t in trials:
        row = rows[t.trial_id]
        assert row["curves_source"] == "mlflow"
        assert row["final_val_loss"] == pytest.approx(t.curve["val/loss"][-1])
        assert row["flops"] == pytest.approx(t.curve["compute/flops"][-1])
        sel = curves.filter(
            pc.and_(
                pc.equal(curves["trial_id"], t.trial_id), pc.equal(curves["metric"], "val/loss")
            )
        )
        assert sel["flops"].to_numpy() == pytest.approx(t.curve["compute/flops"])
        assert sel["value"].to_numpy() == pytest.approx(t.curve["val/loss"])


def test_query_counts_values_warns_and_shows_readable_columns(home):
    beyond = f"flops={max(t.flops for t in home['trials']) * 10!r}"
    with pytest.warns(ResultsWarning, match="no trial has val/loss"):
        groups = query("main", at=beyond, group_by=["variant"])
    assert groups["n"].to_pylist() == [0, 0]  # n counts values, and there are none
    with pytest.warns(ResultsWarning, match="matches no trial"):
        query("main", where="variant == 'nope'")
    from scalelab.cli.main import app

    res = CliRunner().invoke(app, ["results", "query", "main", "--at", beyond])
    assert res.exit_code == 0 and "warning: no trial has val/loss" in res.stderr
    headers = [line for line in res.stdout.splitlines() if line.startswith("┃")]  # folded
    shown = [c.strip() for c in headers[0].strip("┃ ").split("┃")]
    shown += [c.strip() for h in headers[1:] for c in h.strip("┃ ").split("┃")[1:]]
    assert shown[:4] == ["name", "trial_id", "variant", "size"] and "value" in shown
    assert "attn_out" in shown and "seed" not in shown  # the settings that vary, only
    assert "config" not in shown and len(shown) < 16
    assert f"of {load_trials('main').num_columns + 1} columns" in res.stdout


def test_query_filters_groups_and_interpolates_at_flops(home):
    small = query("main", where="variant == 'dense' and size in ['nano', 'micro']")
    assert small.num_rows == 6 and set(small["size"].to_pylist()) == {"nano", "micro"}
    assert query("main", where="1e15 <= flops and not (variant != 'hadamard')").num_rows == sum(
        t.flops >= 1e15 and t.variant == "hadamard" for t in home["trials"]
    )
    groups = query("main", group_by=["variant", "size"])
    assert groups.num_rows == 8 and set(groups["n"].to_pylist()) == {3}
    t = home["trials"][5]
    c, v = t.curve["compute/flops"].tolist(), t.curve["val/loss"].tolist()
    with pytest.warns(ResultsWarning, match=r"\d+ of 24 trials have no val/loss at flops="):
        rows = query("main", metric="val/loss", at=f"flops={c[3]!r}").to_pylist()
    at = {r["trial_id"]: r["value"] for r in rows}
    assert at[t.trial_id] == pytest.approx(v[3])
    mid = float(np.sqrt(c[3] * c[4]))  # half-way in log FLOPs
    got = metric_at(load_curves("main"), "val/loss", f"flops={mid!r}").to_pylist()
    assert dict((r["trial_id"], r["value"]) for r in got)[t.trial_id] == pytest.approx(
        (v[3] + v[4]) / 2
    )
    with pytest.warns(ResultsWarning, match="no trial has val/loss at flops="):
        outside = query(
            "main",
            metric="val/loss",
            at=f"flops={c[-1] * 10!r}",
            where=f"trial_id == '{t.trial_id}'",
        )
    assert outside["value"].to_pylist() == [None]  # never extrapolated, and said so
    final = query("main", metric="val/loss", group_by=["variant"])
    assert final["value_min"].to_pylist()[0] < final["value_max"].to_pylist()[0]
    per_metric = query("main", table="curves", group_by=["variant", "metric"])
    assert per_metric.num_rows == 8 and set(per_metric["n"].to_pylist()) == {12 * STEPS}


@pytest.mark.parametrize(
    "where, message",
    [
        ("nope == 1", "unknown column 'nope'"),
        ("__import__('os').system('true')", "unsupported"),
        ("size in 'nano'", "needs a list"),
        ("variant ==", "not a valid expression"),
        ("variant == 3", "variant"),
    ],
)
def test_bad_where_is_a_clear_error(home, where, message):
    with pytest.raises(ResultsError, match=message):
        query("main", where=where)


def test_fit_recovers_the_known_compute_multiplier(home):
    fit = fit_sweep("main", n_resamples=150)
    [gain] = fit.gains
    m = gain.multiplier
    assert gain.variant == "hadamard" and HADAMARD_M in m, m
    assert m.high - m.low < 0.5 and m.low < m.estimate < m.high
    assert set(fit.laws) == {"dense", "hadamard"} and not fit.notes
    [paired] = fit.paired  # the paired estimator recovers it too
    assert paired.variant == "hadamard" and HADAMARD_M in paired.multiplier, paired.multiplier
    assert {c.size for c in fit.cells} == set(SIZES)
    assert fit.axes == ("size", "train.tokens_per_param") and len(fit.cells) == 3 * len(SIZES)
    json.dumps(fit.to_dict(), allow_nan=False)  # strict JSON: no NaN/inf leaks


def test_bad_input_gives_clear_messages(home):
    write_sweep("onesize", sizes=("nano",), tokens_per_param=(20,), seeds=(3,))
    sync("onesize")
    with pytest.raises(ResultsError, match="one size"):
        fit_sweep("onesize", n_resamples=10)
    write_sweep(
        "nobase", sizes=SIZES[:3], multipliers={"hadamard": 0.8, "tsa": 1.0}, tokens_per_param=(20,)
    )
    sync("nobase")
    with pytest.raises(ResultsError, match="no baseline: variant 'dense'"):
        fit_sweep("nobase", n_resamples=10)
    write_sweep(
        "nans",
        sizes=SIZES,
        multipliers={"dense": 1.0, "tsa": 1.0},
        tokens_per_param=(10, 20, 40),
        nan_variants=("tsa",),
        seeds=(4,),
    )
    sync("nans")
    fit = fit_sweep("nans", n_resamples=10)
    assert "tsa" not in fit.variants and any("NaN" in n for n in fit.notes)
    MlflowClient(workdir.tracking_uri()).create_experiment("empty")
    assert sync("empty").n_trials == 0
    with pytest.raises(ResultsError, match="empty sweep"):
        fit_sweep("empty")
    with pytest.raises(ResultsError, match="unknown sweep 'missing'"):
        sync("missing")
    from scalelab.cli.main import app

    runner = CliRunner()
    for args in (
        ["fit", "onesize"],
        ["fit", "nobase"],
        ["sync", "missing"],
        ["query", "main", "--where", "x ="],
        ["forecast", "main"],  # no target
        ["forecast", "main", "--target", "huge"],
        ["forecast", "main", "--holdout", "2.7B"],
        ["forecast", "main", "--holdout", "micro"],  # one smaller size: too few
        ["advise", "main", "--effect", "5"],
        ["advise", "onesize"],
    ):
        res = runner.invoke(app, ["results", *args])
        assert res.exit_code == 2, (args, res.output)
        assert "error:" in res.output and "Traceback" not in res.output


def test_forecast_and_advice_commands(home):
    """`results forecast` (a larger size, a compute budget, a held-out size) and `results
    advise`, as tables and as JSON, on the sweep drawn from a known law."""
    from scalelab.cli.main import app

    runner = CliRunner()
    res = runner.invoke(app, ["results", "forecast", "main", "--holdout", "124M", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["holdout"] == "124M" and out["fitted_on"].startswith("nano, micro, mini")
    assert len(out["targets"]) == 3 and all(t["actual"] is not None for t in out["targets"])
    truth = {t.trial_id: t for t in home["trials"] if t.size == "124M" and t.variant == "dense"}
    actual = sorted(t.final_loss for t in truth.values())
    assert sorted(t["actual"] for t in out["targets"]) == pytest.approx(actual)
    for t in out["targets"]:
        assert t["low"] < t["predicted"] < t["high"] and t["covered"] == (
            t["low"] <= t["actual"] <= t["high"]
        )
    assert sum(t["covered"] for t in out["targets"]) >= 2  # the law is the truth here
    res = runner.invoke(app, ["results", "forecast", "main", "--target", "350M", "-v", "hadamard"])
    assert res.exit_code == 0, res.output
    assert "forecast of hadamard" in res.output and res.output.count("350M @") == 3
    res = runner.invoke(app, ["results", "forecast", "main", "--flops", "1e20", "--json"])
    [target] = json.loads(res.output)["targets"]
    assert target["flops"] == 1e20 and target["low"] < target["predicted"] < target["high"]
    res = runner.invoke(app, ["results", "advise", "main", "--effect", "0.1", "--json"])
    assert res.exit_code == 0, res.output
    [advice] = json.loads(res.output)
    assert advice["variant"] == "hadamard" and advice["effect"] == 0.1
    assert "reaches the dense loss" in advice["gain"] and advice["current"]["half_width"] > 0
    assert advice["best"] is None or advice["best"]["meets_target"]
    assert advice["measured_resolved"] and advice["measured_multiplier"] < 1  # as the table
    res = runner.invoke(app, ["results", "advise", "main"])
    assert res.exit_code == 0 and "next: hadamard" in res.output
    assert "is told from none already" in res.output and "(--effect" in res.output


def test_sync_keeps_the_rows_results_import_wrote(home, tmp_path):
    """Imported rows have no run behind them: a sync of their sweep keeps them beside the
    runs' rows (and an import again replaces only them)."""
    from scalelab.analysis.results.imports import import_file

    MlflowClient(workdir.tracking_uri()).create_experiment("mixed")
    sync("mixed")
    points = tmp_path / "points.csv"
    points.write_text("N,C,loss\n1e8,1e18,3.1\n2e8,1e18,3.0\n")
    import_file(points, "mixed")
    sync("mixed")
    assert load_trials("mixed")["name"].to_pylist() == ["points.csv:2", "points.csv:3"]
    assert load_trials("mixed")["tokens"].to_pylist() == [round(1e18 / 6e8), round(1e18 / 12e8)]
