"""analysis.report: the Markdown report and summarise_sweep (sync + fit + plots + report)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from synthetic_sweep import write_sweep

from scalelab.analysis.report import summarise_sweep
from scalelab.analysis.results import sweep_dir

DEMO = Path(__file__).resolve().parents[2] / "sweeps" / "demo.yaml"


def record_spec(sweep: str, text: str) -> None:
    """Record a sweep file on the parent run, as a submit does (what the summary prices on)."""
    from mlflow import MlflowClient

    from scalelab.analysis.results.sources import find_sweep_runs
    from scalelab.contract.runs import Tag
    from scalelab.contract.workdir import tracking_uri

    parent = find_sweep_runs(sweep, tracking_uri()).parent_run_id
    MlflowClient(tracking_uri()).set_tag(parent, Tag.SPEC_YAML, text)


@pytest.fixture(scope="module")
def summary(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SCALELAB_HOME", str(tmp_path_factory.mktemp("scalelab")))
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        write_sweep("rep", sizes=("nano", "micro", "mini", "124M"), steps=4,
                    multipliers={"dense": 1.0, "hadamard": 0.8, "budget": 1.0})  # fmt: skip
        record_spec("rep", DEMO.read_text().replace("name: demo", "name: rep"))  # on CPU
        write_sweep("tiny", sizes=("nano",), tokens_per_param=(20,), seeds=(5,))
        yield summarise_sweep("rep", n_resamples=40), summarise_sweep("tiny", n_resamples=10)


def test_summary_prints_gains_with_intervals_plots_and_the_mlflow_ui(summary):
    text, _ = summary
    row = next(line for line in text.splitlines() if line.startswith("│ hadamard"))
    low, high = map(float, re.search(r"\[([\d.]+)×, ([\d.]+)×\]", row).groups())
    assert low <= 0.8 <= high  # the known multiplier, through sync -> fit -> summary
    assert "plots:" in text and "loss_vs_flops" in text and "gains" in text
    assert "scalelab ui " in text
    report = sweep_dir("rep") / "report.md"
    assert f"report: {report}\n" in text
    assert f"report: {report.with_suffix('.html')} (open in a browser)\n" in text
    assert "data:image/png;base64," in report.with_suffix(".html").read_text()
    assert "backtest of dense on held-out 124M" in text  # the forecast, checked in the demo
    assert text.strip().splitlines()[-1].startswith("next: ")  # ends with what to run next


def test_the_summary_opens_with_the_verdict_and_folds_the_checks(summary):
    text, _ = summary
    lines = text.splitlines()
    # first the verdict in words, one line per variant, saying what it holds fixed
    assert (
        lines[0]
        == "verdict: hadamard beats dense at equal compute; no clear gain yet: budget (95% intervals)"
    )
    assert (
        lines[1].startswith("  budget: ") and "at equal size and tokens per parameter" in lines[1]
    )
    assert "more FLOPs: at equal compute, no clear gain" in lines[1]  # budget costs more per token
    assert lines[2].startswith("  hadamard: ") and "fewer FLOPs: at equal compute, 2" in lines[2]
    assert lines[3].startswith("Compute-equivalent gain vs dense")  # then the table
    # the fit checks in one line that points at the report, no `check:` lines
    assert not [line for line in lines if line.startswith("check:")]
    folded = [line for line in lines if line.startswith("fit checks: ")]
    assert len(folded) == 1 and "report.md" in folded[0]
    # one recommendation per variant, priced on the hardware the sweep runs on (CPU)
    advice = [line for line in lines if line.startswith("next: ")]
    assert [line.split(":")[1].strip() for line in advice] == ["budget", "hadamard"]
    assert "CPU-hours (1 core per trial" in advice[0] and "GPU" not in text.split("MLflow UI")[1]
    assert advice[1].startswith("next: hadamard: nothing to add")  # its CI excludes 1


def test_report_has_the_tables_and_links_existing_plots(summary):
    report = (sweep_dir("rep") / "report.md").read_text()
    assert "baseline: `dense` (standard parametrisation);" in report  # model.parametrization
    assert "## Compute-equivalent gain vs dense" in report
    assert re.search(r"^\| hadamard \| 0\.\d\d× \| \[", report, re.M)
    assert "## Loss vs compute" in report and "## Per cell vs dense" in report
    assert "## Forecast backtest: dense on held-out 124M" in report
    assert re.search(r"^\| 124M @ [\d.e+]+ tokens \| [\d.]+ \| \[[\d.]+, [\d.]+\] \| [\d.]+ \| (yes|NO) \|$",
                     report, re.M)  # fmt: skip
    assert "## What to run next" in report and "paired" in report and "unpaired" in report
    links = re.findall(r"!\[[^]]*\]\(([^)]+)\)", report)
    assert links and all((sweep_dir("rep") / link).is_file() for link in links)
    assert report.count("| `") == 36  # one row per trial
    assert "**Verdict: hadamard beats dense at equal compute" in report


def test_summary_of_a_sweep_that_cannot_be_fitted_says_why(summary):
    _, text = summary
    assert "no fit:" in text and "one size (nano)" in text
    # what there is to read without a law: the trials, lowest final val loss first
    assert "tiny: trials by final val loss" in text
    losses = [float(x) for x in re.findall(r"│ +(\d\.\d{4}) │", text)]
    assert losses and losses == sorted(losses)
    assert not (sweep_dir("tiny") / "report.md").exists()


def test_a_summary_of_unchanged_trials_comes_from_its_cache(summary):
    first, _ = summary
    cache = sweep_dir("rep") / "summary.cache.json"
    again = summarise_sweep("rep", n_resamples=40)

    def unsynced(text: str) -> list[str]:
        return [line for line in text.splitlines() if not line.startswith("synced sweep")]

    assert unsynced(again) == unsynced(first)  # all but the sync's line
    stored = json.loads(cache.read_text())
    cache.write_text(json.dumps({**stored, "head": stored["head"].replace("hadamard", "HAD")}))
    assert "HAD" in summarise_sweep("rep", n_resamples=40)  # served from the cache
    assert "HAD" not in summarise_sweep("rep", n_resamples=41)  # other options: fitted again


def test_the_parent_run_carries_the_gains_and_the_report(summary):
    from mlflow import MlflowClient

    from scalelab.analysis.results.sources import find_sweep_runs
    from scalelab.contract.workdir import tracking_uri

    client = MlflowClient(tracking_uri())
    parent = find_sweep_runs("rep", tracking_uri()).parent_run_id
    metrics = client.get_run(parent).data.metrics
    low, m, high = (metrics[f"gain/hadamard/paired{s}"] for s in ("_low", "", "_high"))
    assert low <= m <= high and low <= 0.8 <= high  # the known multiplier, on the parent
    assert {"law/dense/E", "law/dense/alpha", "gain/hadamard/unpaired"} <= set(metrics)
    optimal = [k for k in metrics if k.startswith("optimal/dense/C_")]  # N*(C), D*(C), ...
    assert any(k.endswith("/tokens_per_param_low") for k in optimal) and len(optimal) == 27
    assert "report.md" in {a.path for a in client.list_artifacts(parent)}
    # report.html beside it, what the UI's artifact viewer shows as a page (it shows a
    # Markdown image as text): every plot embedded, nothing to fetch from elsewhere
    page = Path(client.download_artifacts(parent, "report.html")).read_text()
    images = re.findall(r'<img src="([^"]+)"', page)
    plots = {a.path for a in client.list_artifacts(parent, "plots")}
    assert len(images) == len(plots) and all(i.startswith("data:image/png;base64,") for i in images)
    assert "<table>" in page and "Scaling results" in page
