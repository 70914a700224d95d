"""analysis.plots: the figures the data supports, with labelled, scaled axes; PNGs on
disk and as artifacts of the sweep's MLflow parent run."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from mlflow import MlflowClient
from synthetic_sweep import write_sweep

from scalelab.analysis import plots
from scalelab.analysis.results import load_curves, sweep_dir, sync
from scalelab.analysis.results.fit import fit_sweep
from scalelab.analysis.results.sources import find_sweep_runs
from scalelab.contract import workdir
from scalelab.models import catalog

SIZES = ("nano", "micro", "mini", "124M")


@pytest.fixture(scope="module")
def fits(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SCALELAB_HOME", str(tmp_path_factory.mktemp("scalelab")))
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        write_sweep("mech", sizes=SIZES, steps=6, tokens_per_param=(10, 20, 40),
                    multipliers={"dense": 1.0, "budget": 0.9, "tsa": 1.1},
                    mechanism_settings={"tsa": [{"lambda_depth": lam} for lam in (0.0, 0.05)]})  # fmt: skip
        write_sweep("iso", sizes=SIZES, steps=4, isoflop=(1e15, 1e17), shape="chinchilla",
                    multipliers={"dense": 1.0}, seeds=(1,))  # fmt: skip
        out = {}
        for name in ("mech", "iso"):
            sync(name)
            out[name] = fit_sweep(name, n_resamples=20)
        yield out


def test_loss_vs_flops_has_log_compute_axis_curves_and_fitted_laws(fits):
    fit = fits["mech"]
    fig = plots.loss_vs_flops(fit, load_curves("mech"))
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and "FLOPs" in ax.get_xlabel()
    assert "loss" in ax.get_ylabel() and "nats" in ax.get_ylabel()
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    for v in ("dense", "budget", "tsa"):
        assert any(lab.startswith(f"{v}: L = ") for lab in labels)  # the fitted law
    assert "Pareto frontier" in labels
    n_trials = fit.table.num_rows
    assert len(ax.get_lines()) >= n_trials + 3  # one curve per trial + laws + frontier


def plot_named(name: str):
    return next(p for p in catalog.plots() if p.name == name)


def test_supported_figures_only(fits):
    mech = plots.figures(fits["mech"], load_curves("mech"))
    assert set(mech) == {"loss_vs_flops", "loss_vs_params", "gains", "budget_s_mean", "tsa_alpha"}
    iso = plots.figures(fits["iso"], None)
    assert set(iso) == {"loss_vs_flops", "loss_vs_params", "isoflop"}  # one variant: no gains
    ax = iso["isoflop"].axes[0]
    assert ax.get_xscale() == "log" and "parameters" in ax.get_xlabel()
    assert len(ax.get_legend().get_texts()) == 2  # one parabola per budget


def test_gain_and_mechanism_axes(fits):
    fit = fits["mech"]
    ax = plots.gains(fit).axes[0]
    assert ax.get_xscale() == "log" and "dense" in ax.get_xlabel()
    assert [t.get_text() for t in ax.get_yticklabels()] == [g.variant for g in fit.gains]
    ax = plots.metric_figure(fit.table, plot_named("tsa_alpha")).axes[0]
    assert "λ" in ax.get_xlabel() and "α" in ax.get_ylabel()
    assert len(ax.get_lines()) == len(SIZES) * 3  # one line per size and budget, across lambdas
    ax = plots.metric_figure(fit.table, plot_named("budget_s_mean")).axes[0]
    assert ax.get_xscale() == "log" and "budget" in ax.get_ylabel()


def test_make_plots_writes_pngs_and_logs_them_on_the_parent_run(fits):
    out = sweep_dir("mech") / "plots"
    files = plots.make_plots(fits["mech"], load_curves("mech"), out)
    assert all(
        p.stat().st_size > 10_000 and p.read_bytes()[:4] == b"\x89PNG" for p in files.values()
    )
    uri = workdir.tracking_uri()
    parent = find_sweep_runs("mech", uri).parent_run_id
    assert plots.log_plots(parent, files, uri)
    logged = {a.path for a in MlflowClient(uri).list_artifacts(parent, "plots")}
    assert logged == {f"plots/{p.name}" for p in files.values()}


def test_mechanism_plots_average_over_seeds_only_and_say_so():
    """Two budgets and two seeds per cell: a line per budget whose points are the cells'
    means over seeds (these plots once averaged the budgets of a size together)."""
    cols = {k: [] for k in ("variant", "size", "n_params", "tokens", "seed", "tsa_lambda",
                            "tsa_alpha", "budget_s_mean")}  # fmt: skip
    for size, n in (("nano", 1.2e5), ("tiny", 3.7e5)):
        for tokens in (32768, 98304):
            for lam in (0.01, 0.05):
                for seed in (0, 1):
                    alpha = 0.1 + lam + tokens / 1e6 + n / 1e7 + 0.02 * seed
                    row = (
                        "tsa",
                        size,
                        n,
                        tokens,
                        seed,
                        lam,
                        alpha,
                        0.5 + tokens / 1e6 + 0.02 * seed,
                    )
                    for key, value in zip(cols, row, strict=True):
                        cols[key].append(value)
    table = pa.table(cols)
    ax = plots.metric_figure(table, plot_named("tsa_alpha")).axes[0]
    assert "mean over seeds" in " ".join(ax.get_title().split())
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert set(lines) == {f"{s}, tokens={t}" for s in ("nano", "tiny") for t in (32768, 98304)}
    line = lines["tiny, tokens=98304"]
    expected = [0.1 + lam + 98304 / 1e6 + 3.7e5 / 1e7 + 0.01 for lam in (0.01, 0.05)]
    np.testing.assert_allclose(line.get_ydata(), expected)  # mean of seeds 0 and 1 only
    ax = plots.metric_figure(
        table.set_column(0, "variant", pa.array(["budget"] * table.num_rows)),
        plot_named("budget_s_mean"),
    ).axes[0]
    assert "mean over seeds" in " ".join(ax.get_title().split())
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert set(lines) == {"budget, tokens=32768", "budget, tokens=98304"}
    np.testing.assert_allclose(
        lines["budget, tokens=32768"].get_ydata(), [0.5 + 0.032768 + 0.01] * 2
    )


def test_the_law_label_says_when_a_law_fell_back_or_failed_its_check():
    """A ladder with no irreducible loss (E = 0): the law falls back to A·C^-alpha and the
    legend says so; the demo's BudgetFormer frontier: its law is not pinned down."""
    from synthetic_ladder import DEMO, SIZES, as_trials, ladder

    from scalelab.analysis.results.fit import fit_table

    sizes = {k: SIZES[k] for k in ("nano", "tiny", "micro", "mini")}
    truth = DEMO.with_noise(E=0.0, cell_sd=0.002, trial_sd=0.002)
    table = as_trials(ladder(np.random.default_rng(0), truth, multipliers={"dense": 1.0},
                             sizes=sizes, tokens=(32_768,)))  # fmt: skip
    fit = fit_table(table, "no-e")
    legend = [t.get_text() for t in plots.loss_vs_flops(fit, None).axes[0].get_legend().get_texts()]
    [label] = [t for t in legend if t.startswith("dense: L = ")]
    assert fit.law_checks["dense"].fallback and "no E: fallback" in label
    assert "check failed" not in label
    budget = pa.table({
        "variant": ["dense"] * 5, "size": ["a", "b", "c", "d", "e"],
        "flops": [2.751e10, 8.12e10, 8.252e10, 2.436e11, 5.425e11],
        "n_params": [1e5, 3e5, 1e5, 3e5, 8e5], "tokens": [3e4, 3e4, 1e5, 1e5, 1e5],
        "final_loss": [3.8588, 3.3585, 2.9442, 2.6848, 2.5903],
    })  # fmt: skip
    fit = fit_table(as_trials(budget), "budget")
    label = plots.law_label(fit, "dense")
    assert fit.law_checks["dense"].failed and "no E" not in label
    assert "check failed" not in label and not label.endswith("†")  # the only law: the title
    title = " ".join(plots.loss_vs_flops(fit, None).axes[0].get_title().split())
    assert "every law failed a fit check" in title


def test_a_downstream_score_is_drawn_against_flops_a_line_per_variant():
    """A ladder (tokens grow with the size) with two seeds: one line per variant through its
    sizes, each point the mean over seeds with its standard error; the figure is among
    those a sweep's data supports once it has the column."""
    rows = []
    for variant, lift in (("dense", 0.0), ("hadamard", 0.01)):
        for size, n in (("nano", 1.2e5), ("tiny", 3.7e5), ("micro", 1.1e6)):
            for seed in (0, 1):
                acc = 0.4 + n / 1e7 + lift + 0.02 * seed
                rows.append({"variant": variant, "size": size, "n_params": n, "tokens": 20 * n,
                             "flops": 120 * n * n, "seed": seed, "eval_piqa_acc": acc})  # fmt: skip
    table = pa.Table.from_pylist(rows)
    ax = plots.downstream_vs_flops(table, "eval_piqa_acc").axes[0]
    assert ax.get_xscale() == "log" and "mean over seeds" in " ".join(ax.get_title().split())
    lines = {bars.get_label(): bars.lines[0] for bars in ax.containers}  # errorbar's
    assert set(lines) == {"dense", "hadamard"}
    chance = [line for line in ax.get_lines() if line.get_label() == "chance (0.5)"]
    assert len(chance) == 1 and set(chance[0].get_ydata()) == {0.5}  # piqa: two choices
    sizes = (1.2e5, 3.7e5, 1.1e6)
    np.testing.assert_allclose(lines["hadamard"].get_xdata(), [120 * n * n for n in sizes])
    np.testing.assert_allclose(
        lines["hadamard"].get_ydata(), [0.4 + n / 1e7 + 0.01 + 0.01 for n in sizes]
    )
    assert plots.downstream_vs_flops(table, "eval_arc_easy_acc") is None
