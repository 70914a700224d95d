"""One name, one time, one width (issue 27 items 4-6): a trial's run name is taken wherever
its id is; its run time and queue time read the same in every view; tables honour COLUMNS
in a pipe. On real MLflow runs: a sweep's placeholders (`Ledger.sync`) and a synthetic
sweep whose runs were launched 70 s before they ended."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import sweep_yaml
from synthetic_sweep import write_sweep
from typer.testing import CliRunner

from scalelab.cli.main import app
from scalelab.contract.workdir import trial_log
from scalelab.orchestrator.ledger import Ledger
from scalelab.orchestrator.plan.expand import expand
from scalelab.orchestrator.plan.spec import parse_spec
from scalelab.orchestrator.trial_select import UnknownTrial, select

runner = CliRunner()
SCALELAB = Path(sys.executable).with_name("scalelab")
LONG_ERROR = "RuntimeError: " + "a long explanation of what went wrong " * 6


@pytest.fixture(scope="module")
def home(work_home):
    """`live`: three SCHEDULED placeholders (named by seed), one made FAILED with a long
    error; `times`: four finished runs of 70 s, queued 3 s each."""
    live, times = (f"{what}-{uuid.uuid4().hex[:6]}" for what in ("live", "times"))
    spec, source = parse_spec(sweep_yaml(live, seeds=3, first_seed=870))
    ledger = Ledger(spec.name)
    records = ledger.sync(spec, expand(spec, source))
    failed = next(r for r in records.values() if r.name.endswith("-s872"))
    ledger.set_tags(failed.run_id, {"scalelab.error": LONG_ERROR})
    ledger.set_status(failed.run_id, "FAILED")
    trials = write_sweep(times, sizes=("nano",), tokens_per_param=(20,), seeds=(0, 1), steps=4,
                         run_time_s=70.0)  # fmt: skip
    return {"root": work_home, "live": live, "times": times, "trials": trials}


def _by_name(sweep: str, name: str):
    return next(r for r in Ledger(sweep).records().values() if r.name == name)


def test_a_run_name_is_taken_wherever_a_trial_id_is(home):
    live, times = home["live"], home["times"]
    rec = _by_name(live, "dense-nano-s871")
    status = runner.invoke(app, ["status", live, "dense-nano-s871", "--json"])
    assert status.exit_code == 0, status.output
    assert [t["trial_id"] for t in json.loads(status.stdout)["trials"]] == [rec.trial_id]

    log = trial_log(rec.trial_id)
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("what dense-nano-s871 printed\n")
    logs = runner.invoke(app, ["logs", live, "dense-nano-s871"])
    assert logs.exit_code == 0 and "what dense-nano-s871 printed" in logs.stdout, logs.output

    # the name leads to the trial's id, whose folder holds no checkpoint here
    generate = runner.invoke(app, ["generate", "dense-nano-s871", "--prompt", "a"])
    assert generate.exit_code == 2 and repr(rec.trial_id) in generate.stderr, generate.output

    second = _by_name(times, f"dense-nano-{home['trials'][1].trial_id[:8]}")
    where = ["--where", f"name == '{second.name}'"]
    query = runner.invoke(app, ["results", "query", times, "--format", "json", *where])
    assert query.exit_code == 0, query.output
    assert [r["trial_id"] for r in json.loads(query.stdout)] == [second.trial_id]

    cancel = runner.invoke(app, ["cancel", live, "dense-nano-s871"])
    assert cancel.exit_code == 0 and "cancel requested for 1 trial(s)" in cancel.stdout
    assert Ledger(live).records()[rec.trial_id].status == "KILLED"


def test_a_name_that_is_no_trial_or_several_is_one_clear_error(home):
    live = home["live"]
    wrong = runner.invoke(app, ["status", live, "dense-nano-s8710"])
    assert wrong.exit_code == 2
    expected = f"no trial 'dense-nano-s8710' in sweep {live}, did you mean 'dense-nano-s871'?"
    assert expected in wrong.stderr
    names = {"ab12": "dense-nano-s0", "ab34": "dense-nano-s1"}
    with pytest.raises(UnknownTrial, match=r"'ab' matches 2 trials of sweep x: dense-nano-s0"):
        select(names, "ab", "x")
    assert select(names, "ab3", "x") == "ab34" and select(names, "dense-nano-s0", "x") == "ab12"


def test_one_run_time_and_one_queue_time_in_every_view(home):
    from mlflow import MlflowClient
    from rich.console import Console

    from scalelab.analysis.report import _trial_rows
    from scalelab.analysis.results import load_trials
    from scalelab.cli.sweep_view import TrialLines
    from scalelab.contract.workdir import tracking_uri
    from scalelab.orchestrator.plan.expand import Trial

    times, first = home["times"], home["trials"][0]
    run = MlflowClient(tracking_uri()).get_run(first.run_id).info
    assert run.end_time - run.start_time == 70_000  # MLflow's own Duration column
    rows = json.loads(runner.invoke(app, ["status", times, "--json"]).stdout)["trials"]
    assert {(r["duration_s"], r["queued_s"]) for r in rows} == {(70.0, 3.0)}
    table = runner.invoke(app, ["status", times]).stdout
    assert table.count("1m10s") == 4 and table.count(" 3s ") == 4, table

    query = runner.invoke(app, ["results", "query", times])
    assert query.exit_code == 0 and query.stdout.count("1m10s") == 4, query.output
    fit = SimpleNamespace(table=load_trials(times), loss="final_val_loss")  # as fit_sweep's
    head, report_rows = _trial_rows(fit)
    assert {(r[head.index("time")], r[head.index("queued")]) for r in report_rows} == {
        ("1m10s", "3s")
    }

    console = Console(file=io.StringIO(), width=200)
    trial = Trial(None, first.trial_id, first.variant, first.size, first.n_params, 0,
                  first.tokens, first.flops)  # fmt: skip
    lines = TrialLines(console, [trial], set(), Ledger(times))
    lines.ended(first.trial_id, "finished")  # the line `submit` prints as a trial ends
    assert "1m10s" in console.file.getvalue()


def test_columns_is_honoured_in_a_pipe(home):
    env = {**os.environ, "SCALELAB_HOME": str(home["root"]), "COLUMNS": "80"}
    env.pop("MLFLOW_TRACKING_URI", None)
    done = subprocess.run(
        [str(SCALELAB), "status", home["live"]], env=env, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert max(len(line) for line in done.stdout.splitlines()) <= 80, done.stdout
    assert "long explanation" in done.stdout and "dense-nano-s872" in done.stdout


def test_a_launch_time_is_written_for_people_and_read_back_from_older_runs_too():
    """`scalelab.started` is UTC ISO 8601 in the MLflow UI (not epoch ms); runs recorded
    before it have `scalelab.started_ms`, and their times still read the same."""
    from scalelab.contract.trial_time import (
        duration_text,
        parse_timestamp,
        run_seconds,
        timestamp_text,
    )

    ms = 1_796_251_437_893
    assert timestamp_text(ms) == "2026-12-02T22:43:57.893Z"
    assert parse_timestamp(timestamp_text(ms)) == ms
    assert parse_timestamp("1796251437893") is None  # not a time a person wrote
    new = {"scalelab.started": timestamp_text(ms)}
    old = {"scalelab.started_ms": str(ms)}
    assert (
        run_seconds(new, "FINISHED", ms + 70_000)
        == run_seconds(old, "FINISHED", ms + 70_000)
        == 70.0
    )
    # one way to write a time, the plan's hours-long trials included
    assert [duration_text(s) for s in (1.2, 70, 2 * 3600 + 300, 3 * 86400 + 4 * 3600)] == [
        "1s", "1m10s", "2h05m", "3d04h"
    ]  # fmt: skip


def test_a_cooldown_branch_and_its_trunk_show_as_such_in_every_view(work_home):
    """A wsd trial that trained its cooldown off a trunk's checkpoint (its run tagged
    `scalelab.branched_from` by the job) says so in `status`, is selectable in `results
    query`, and the report's trial table names its trunk."""
    from types import SimpleNamespace

    from mlflow import MlflowClient

    from scalelab.analysis.report import _trial_rows
    from scalelab.analysis.results import load_trials
    from scalelab.contract.workdir import tracking_uri

    sweep = f"branch-{uuid.uuid4().hex[:6]}"
    trials = write_sweep(sweep, sizes=("nano",), tokens_per_param=(10, 20), steps=4)
    branch, trunk = sorted((t for t in trials if t.variant == "dense"), key=lambda t: t.tokens)
    MlflowClient(tracking_uri()).set_tag(
        branch.run_id, "scalelab.branched_from", f"{trunk.trial_id}@3"
    )

    rows = json.loads(runner.invoke(app, ["status", sweep, "--json"]).stdout)["trials"]
    by_id = {r["trial_id"]: r for r in rows}
    assert by_id[branch.trial_id]["branched_from"] == f"{trunk.trial_id}@3"
    assert by_id[trunk.trial_id]["branches"] == 1
    table = runner.invoke(app, ["status", sweep], env={"COLUMNS": "200"}).stdout
    assert f"branch of {trunk.trial_id[:8]} at step 3" in table and "trunk of 1" in table, table

    where = ["--where", "not (branched_from is None)", "--format", "json"]
    query = runner.invoke(app, ["results", "query", sweep, *where])
    assert query.exit_code == 0, query.output
    assert [r["trial_id"] for r in json.loads(query.stdout)] == [branch.trial_id]
    head, report_rows = _trial_rows(
        SimpleNamespace(table=load_trials(sweep), loss="final_val_loss")
    )
    labels = [r[head.index("trial")] for r in report_rows]
    assert sum(f"(branch of `{trunk.trial_id[:8]}` at step 3)" in label for label in labels) == 1


def test_the_live_figure_draws_a_cooldown_branch_dashed(work_home):
    """The parent run's live loss-vs-FLOPs figure (analysis/live_figure.py) tells a wsd
    branch from a trial trained from step 0: dashed, counted in the title and the PNG."""
    from types import SimpleNamespace

    from mlflow import MlflowClient
    from mlflow.entities import Metric as MlflowMetric
    from PIL import Image

    from scalelab.analysis.live_figure import BRANCHES_KEY, FINISHED_KEY, FOLDER, NAME, LiveFigure
    from scalelab.contract.workdir import tracking_uri

    sweep = f"figure-{uuid.uuid4().hex[:6]}"
    trials = write_sweep(sweep, sizes=("nano",), tokens_per_param=(10, 20), steps=4)
    branch, trunk = sorted((t for t in trials if t.variant == "dense"), key=lambda t: t.tokens)
    client = MlflowClient(tracking_uri())
    for t in (branch, trunk):
        points = [MlflowMetric("val/loss_at_gflop", 5.0 / s, 0, s) for s in (1, 2, 4)]
        client.log_batch(t.run_id, metrics=points)
    client.set_tag(branch.run_id, "scalelab.branched_from", f"{trunk.trial_id}@3")
    ledger = Ledger(sweep)
    ledger.find_parent()
    figure = LiveFigure(
        ledger, [SimpleNamespace(trial_id=t.trial_id, variant="dense") for t in (branch, trunk)]
    )
    figure.min_interval_s = 0.0
    for t in (trunk, branch):
        figure.trial_ended(t.trial_id, "finished")
    drawn = figure._draw(figure._read_curves())
    styles = sorted(line.get_linestyle() for line in drawn.axes[0].lines)
    assert styles == ["-", "--"] and "1 cooldown branches, dashed" in drawn.axes[0].get_title()
    png = client.download_artifacts(ledger.parent_id, f"{FOLDER}/{NAME}", str(work_home))
    assert Image.open(png).text[FINISHED_KEY] == "2" and Image.open(png).text[BRANCHES_KEY] == "1"
