"""Watching a sweep: what a failed trial leaves (its log, traceback, the summary and a hint),
`status` and `logs`, and what the MLflow UI will show (read through a real `mlflow server`'s
REST API)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.parse
import urllib.request
import warnings
from pathlib import Path

import pytest
from conftest import calls, sweep_yaml
from faults import browser
from faults.mlflow_kit import MlflowServer
from typer.testing import CliRunner

from scalelab.cli.main import app
from scalelab.contract.trial_time import parse_timestamp
from scalelab.contract.workdir import tracking_uri, trial_dir, trial_log
from scalelab.jobs.tracking.trial_logs import follow
from scalelab.orchestrator.ledger import Ledger
from scalelab.orchestrator.plan.expand import expand
from scalelab.orchestrator.plan.spec import parse_spec

runner = CliRunner()
SCALELAB = Path(sys.executable).with_name("scalelab")
ONCE = "{concurrency: 2, max_retries: 0, cpus_per_trial: 0.5}"


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "sweep.yaml"
    path.write_text(text)
    return path


def test_a_failed_trial_leaves_its_log_and_the_summary_still_comes(
    tmp_path, ray_session, work_home, sweep_name
):
    path = _write(tmp_path, sweep_yaml(sweep_name, seeds=2))  # max_retries: 2 in the file
    talkative = ["--job", "jobs_for_tests:talkative"]
    result = runner.invoke(app, ["submit", str(path), "backend.max_retries=0", *talkative])
    assert result.exit_code == 1, result.output
    recs = Ledger(sweep_name).records()
    failed = next(r for r in recs.values() if r.status == "FAILED")
    assert (
        f"({failed.trial_id}) failed after 1 attempt(s): RuntimeError: talkative" in result.stdout
    )
    assert f"scalelab logs {sweep_name} {failed.trial_id[:8]}" in result.stdout  # the hint
    assert f"synced sweep '{sweep_name}'" in result.stdout  # the summary, despite the failure
    resumed = runner.invoke(app, ["resume", sweep_name, *talkative])
    assert resumed.exit_code == 0, resumed.output  # with the recorded override: no retry left
    assert calls(work_home, failed.run_id) == 1

    logs = trial_dir(failed.trial_id) / "logs"
    log = (logs / "trial.log").read_text()
    for line in ("stdout of seed 1", "stderr of seed 1", "child process of seed 1"):
        assert line in log  # fds 1 and 2, the child process's too
    assert "RuntimeError: talkative trial fails" in (logs / "traceback.txt").read_text()

    shown = runner.invoke(app, ["logs", sweep_name, failed.trial_id[:8]])
    assert shown.exit_code == 0 and "stderr of seed 1" in shown.stdout
    status = json.loads(runner.invoke(app, ["status", sweep_name, "--json"]).stdout)
    row = next(t for t in status["trials"] if t["trial_id"] == failed.trial_id)
    assert row["error"].endswith("x" * 80) and row["log"] == str(logs / "trial.log")
    table = runner.invoke(app, ["status", sweep_name]).stdout
    assert "long explanation" in table and "log:" in table  # not cut at 60 characters

    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri())
    top = {a.path for a in client.list_artifacts(failed.run_id)}
    attached = {a.path for a in client.list_artifacts(failed.run_id, "logs")}
    assert "job.json" in top and {"logs/trial.log", "logs/traceback.txt"} <= attached


@pytest.mark.slow
def test_parent_loss_vs_flops_figure_fills_in_as_trials_finish(
    tmp_path, ray_session, work_home, sweep_name
):
    from mlflow import MlflowClient
    from PIL import Image

    from scalelab.analysis.live_figure import FINISHED_KEY, FOLDER, NAME

    one_at_a_time = "{concurrency: 1, max_retries: 0, cpus_per_trial: 0.5}"
    path = _write(tmp_path, sweep_yaml(sweep_name, seeds=2, backend=one_at_a_time))
    job = ["--job", "jobs_for_tests:curve", "--no-summary"]
    result = runner.invoke(app, ["submit", str(path), *job])
    assert result.exit_code == 0, result.output
    ledger = Ledger(sweep_name)
    seen = sorted(
        p.name.split("-")[1]
        for rec in ledger.records().values()
        for p in (work_home / "calls" / rec.run_id).glob("figure-*")
    )
    assert seen == ["1", "none"]  # the second trial saw the first one's curve on the parent
    client = MlflowClient(tracking_uri())
    png = client.download_artifacts(ledger.find_parent(), f"{FOLDER}/{NAME}", str(tmp_path))
    assert Image.open(png).text[FINISHED_KEY] == "2"  # and both at the end


@pytest.mark.slow
def test_logs_follow_prints_what_is_appended_and_exits_when_the_trial_ends(work_home, sweep_name):
    spec, source = parse_spec(sweep_yaml(sweep_name, seeds=1, first_seed=7400))
    (trial,) = expand(spec, source)
    ledger = Ledger(spec.name)
    rec = ledger.sync(spec, [trial])[trial.trial_id]
    ledger.set_status(rec.run_id, "RUNNING")
    log = trial_log(trial.trial_id)
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("before following\n")
    command = [str(SCALELAB), "logs", sweep_name, trial.trial_id[:8], "--follow"]
    follower = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert follower.stdout.readline() == "before following\n"
        with log.open("a") as f:
            f.write("appended while following\n")
        assert follower.stdout.readline() == "appended while following\n"
        with log.open("a") as f:
            f.write("the last words\n")
        ledger.set_status(rec.run_id, "FINISHED")
        rest, errors = follower.communicate(timeout=30)  # it stops by itself
    finally:
        follower.kill()
    assert follower.returncode == 0, errors
    assert rest == "the last words\n" and f"{trial.trial_id} ended: FINISHED" in errors


@pytest.mark.slow
def test_logs_follow_waits_for_a_trial_that_has_not_started(work_home, sweep_name):
    """As `tail -F`: a SCHEDULED trial with no log yet is waited for, its log printed from
    its first line once it starts (was: exit 2, 'has not run on this machine')."""
    spec, source = parse_spec(sweep_yaml(sweep_name, seeds=1, first_seed=7450))
    (trial,) = expand(spec, source)
    ledger = Ledger(spec.name)
    rec = ledger.sync(spec, [trial])[trial.trial_id]
    log = trial_log(trial.trial_id)
    assert not log.exists()
    command = [str(SCALELAB), "logs", sweep_name, trial.trial_id[:8], "--follow"]
    follower = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(2.0)
        assert follower.poll() is None  # still waiting
        ledger.set_status(rec.run_id, "RUNNING")
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text("first words\n")
        assert follower.stdout.readline() == "first words\n"
        with log.open("a") as f:
            f.write("last words\n")
        ledger.set_status(rec.run_id, "FINISHED")
        rest, errors = follower.communicate(timeout=30)
    finally:
        follower.kill()
    assert follower.returncode == 0, errors
    assert rest == "last words\n"
    assert "waiting for its log" in errors and f"{trial.trial_id} ended: FINISHED" in errors


def test_logs_shows_rank_0s_log_and_another_ranks_on_request(work_home, sweep_name):
    """Issue 26, item 8: each rank of a trial of several has its own log; `logs` shows the
    trial's (rank 0's) and, with --rank, another rank's."""
    spec, source = parse_spec(sweep_yaml(sweep_name, seeds=1, first_seed=7500))
    (trial,) = expand(spec, source)
    Ledger(spec.name).sync(spec, [trial])
    trial_log(trial.trial_id).parent.mkdir(parents=True, exist_ok=True)
    trial_log(trial.trial_id).write_text("rank 0 speaking\n")
    trial_log(trial.trial_id, 1).write_text("rank 1 speaking\n")
    shown = runner.invoke(app, ["logs", sweep_name, trial.trial_id[:8]])
    assert shown.exit_code == 0 and shown.stdout == "rank 0 speaking\n"
    other = runner.invoke(app, ["logs", sweep_name, trial.trial_id[:8], "--rank", "1"])
    assert other.exit_code == 0 and other.stdout == "rank 1 speaking\n"
    missing = runner.invoke(app, ["logs", sweep_name, trial.trial_id[:8], "--rank", "5"])
    assert missing.exit_code != 0 and "rank1.log" in missing.output


def test_follow_stops_at_its_bound_while_the_trial_runs(tmp_path):
    log = tmp_path / "trial.log"
    log.write_text("old\nnew ✓\n")
    written: list[str] = []
    started = time.monotonic()
    ended = follow(log, 4, lambda: False, written.append, poll_s=0.05, timeout_s=0.3)
    assert not ended and 0.3 <= time.monotonic() - started < 5
    assert "".join(written) == "new ✓\n"


def _get(uri: str, route: str, login: dict | None = None, **query: str) -> dict:
    url = f"{uri}/api/2.0/mlflow/{route}?{urllib.parse.urlencode(query)}"
    with urllib.request.urlopen(urllib.request.Request(url, headers=login or {}), timeout=30) as r:
        return json.loads(r.read())


def _post(uri: str, route: str, body: dict, login: dict | None = None) -> dict:
    request = urllib.request.Request(
        f"{uri}/api/2.0/mlflow/{route}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", **(login or {})},
    )
    with urllib.request.urlopen(request, timeout=30) as r:
        return json.loads(r.read())


# what the test reads of the page after its DOM: each chart card's title and its plot's axes
# (plotly's own layout), the runs table's header cells, and what the page stored
CHART_CARDS = (
    "Array.from(document.querySelectorAll('[data-testid=\"experiment-view-compare-runs-card\"]'))"
    '.map(c => { const p = c.querySelector(".js-plotly-plot"), l = p && p._fullLayout;'
    ' return {title: (c.querySelector("h4") || {}).textContent || null,'
    " x: l ? l.xaxis.type : null, y: l ? l.yaxis.type : null}; })"
)
TABLE_HEADERS = (
    'Array.from(document.querySelectorAll(".ag-header-cell[col-id]"))'
    '.map(h => [h.getAttribute("col-id"), h.getBoundingClientRect().left])'
)
PAGE_AND_VIEW = (
    f'{browser.DOM} + "<!--view " + JSON.stringify({{charts: {CHART_CARDS},'
    f" columns: {TABLE_HEADERS}, assistant: localStorage.getItem("
    '"mlflow.assistant.fab.autoOpenedOnFirstLoad_v1")}) + " view-->"'
)
FIRST_CHART = '{"title":"val/loss_at_gflop","x":"log","y":"log"}'  # val/loss at step = GFLOPs
SECOND_CHART = '{"title":"val/loss","x":"linear","y":"log"}'  # against compute/flops


def _view(dom: str) -> dict:
    return json.loads(dom.split("<!--view ")[1].split(" view-->")[0])


def _log_curves(runs: list[str]) -> None:
    """What a training job logs, in small: val/loss and compute/flops at the same steps, and
    val/loss with step = GFLOPs (the ledger's test jobs log no metrics)."""
    from mlflow import MlflowClient
    from mlflow.entities import Metric as MlflowMetric

    client = MlflowClient(tracking_uri())
    now = int(time.time() * 1000)
    for i, run_id in enumerate(runs):
        points = []
        for step in (10, 20, 40, 80):
            flops, loss = step * 2.5e9, 6.0 / (1 + i) * step**-0.2
            points += [MlflowMetric("val/loss", loss, now, step),
                       MlflowMetric("compute/flops", flops, now, step),
                       MlflowMetric("val/loss_at_gflop", loss, now, int(flops / 1e9))]  # fmt: skip
        client.log_batch(run_id, metrics=points)


def _in_a_browser(server: MlflowServer, experiment_id: str) -> None:
    """What a first visit shows, through headless Chromium where the machine has one, logged
    in as the owner answers the login prompt: the saved view of the trials at the address
    `scalelab ui` prints (but for workflowType: model training is the page's default), on
    its charts: first val/loss against GFLOPs on log axes, the runs grouped by variant
    beside them, MLflow's assistant panel not opened. Without Chromium, only the page and
    tags are checked."""
    if browser.chromium() is None:
        warnings.warn(
            "no Chromium (apt-get install chromium): the UI is not opened in a browser",
            stacklevel=2,
        )
        return
    url = f"{server.uri}/#/experiments/{experiment_id}/runs?viewStateShareKey=scalelab-trials"
    # every chart drawn: a chart's axes are read once plotly has laid them out
    showing = ("dense-nano-lr0.001", "Group: dense", FIRST_CHART, SECOND_CHART)
    dom = browser.page_after_login(
        f"{url}&compareRunsMode=CHART", *server.login(), showing=showing, timeout_s=120,
        expression=PAGE_AND_VIEW,
    )  # fmt: skip
    found = {text: text in dom for text in showing}
    assert all(found.values()), found  # the trials grouped by variant, beside the charts
    assert "Detect issues" not in dom  # not the GenAI overview
    view = _view(dom)
    assert view["assistant"] == "true"  # the page's default: the panel has shown itself
    assert "mlflow.assistant.chat_panel" not in dom  # so it is closed
    assert "MLflow Assistant" in dom  # and its button is there to open it
    charts = view["charts"]
    assert charts[0] == json.loads(FIRST_CHART), charts  # log-log, the first chart
    assert charts[1] == json.loads(SECOND_CHART), charts  # vs FLOPs

    showing = ("dense-nano-lr0.001", "metrics.`val/loss`")  # the table view of the same
    dom = browser.page_after_login(
        url, *server.login(), showing=showing, timeout_s=120, expression=PAGE_AND_VIEW
    )
    columns = dict(_view(dom)["columns"])
    assert "metrics.`val/loss`" in columns, columns
    ours = {c: x for c, x in columns.items() if c.split(".")[0] in ("metrics", "params", "tags")}
    assert min(ours, key=ours.__getitem__) == "metrics.`val/loss`", columns  # after the name
    assert "metrics.`compute/flops`" not in columns  # no raw integer cut to the width


@pytest.mark.slow
def test_what_the_mlflow_ui_shows(tmp_path, ray_session, work_home, sweep_name):
    text = sweep_yaml(sweep_name, seeds=1, backend=ONCE).replace(
        "grid:", "description: lr sweep of the nano model\ngrid:\n  train.lr: [0.001, 0.003]"
    )
    launched = int(time.time() * 1000)
    result = runner.invoke(app, ["submit", str(_write(tmp_path, text)), "--job", "jobs_for_tests:count"])  # fmt: skip
    assert result.exit_code == 0, result.output
    _log_curves([r.run_id for r in Ledger(sweep_name).records().values()])
    server = MlflowServer(tracking_uri(), scalelab_ui=True).start()
    try:
        login = server.headers()  # the owner's login: `scalelab ui` lets no one in without it
        got = _get(server.uri, "experiments/get-by-name", login, experiment_name=sweep_name)
        exp = got["experiment"]
        tags = {t["key"]: t["value"] for t in exp["tags"]}
        assert tags["mlflow.experimentKind"] == "custom_model_development"  # opens on runs
        assert tags["mlflow.note.content"] == "lr sweep of the nano model"
        view = json.loads(json.loads(tags["mlflow.sharedViewState.scalelab-trials"])["state"])
        assert {"params.`train.lr`", "metrics.`val/loss`"} <= set(view["selectedColumns"])
        assert view["compareRunCharts"][0]["xAxisScaleType"] == "log"  # its charts come too
        page_request = urllib.request.Request(f"{server.uri}/", headers=login)
        with urllib.request.urlopen(page_request, timeout=30) as page:
            html = page.read()
        assert b'"mlflow.workflowType_v1"' in html  # model training by default
        assert b'"mlflow.assistant.fab.autoOpenedOnFirstLoad_v1"' in html  # no assistant
        _in_a_browser(server, exp["experiment_id"])
        search = {"experiment_ids": [exp["experiment_id"]]}
        runs = _post(server.uri, "runs/search", search, login)["runs"]
        children = [r for r in runs if r["info"]["run_name"] != f"sweep:{sweep_name}"]
        names = sorted(r["info"]["run_name"] for r in children)
        assert names == ["dense-nano-lr0.001", "dense-nano-lr0.003"]
        for run in children:
            params = {p["key"]: p["value"] for p in run["data"]["params"]}
            assert "null" not in params.values() and params["train.tokens"] == "4096"
            assert "tokens" not in params  # no second spelling of train.tokens
            run_tags = {t["key"]: t["value"] for t in run["data"]["tags"]}
            assert (
                parse_timestamp(run_tags["scalelab.started"]) >= launched
            )  # when it really started
            assert run_tags["mlflow.runColor"].startswith("#")  # its variant's colour
            listed = _get(server.uri, "artifacts/list", login, run_id=run["info"]["run_id"])
            assert {"job.json", "logs"} <= {f["path"] for f in listed["files"]}
    finally:
        server.stop()


@pytest.mark.slow
def test_the_mlflow_ui_shows_when_each_trial_really_started(
    tmp_path, ray_session, work_home, sweep_name
):
    """Concurrency 1: the second trial waits for the first. Its run's start time (the UI's
    Created, and Duration's start) is its launch, not the scheduling of the sweep."""
    text = sweep_yaml(sweep_name, seeds=2, first_seed=7300, backend="{concurrency: 1}")
    result = runner.invoke(app, ["submit", str(_write(tmp_path, text)), "--job", "jobs_for_tests:count"])  # fmt: skip
    assert result.exit_code == 0, result.output
    server = MlflowServer(tracking_uri()).start()
    try:
        exp = _get(server.uri, "experiments/get-by-name", experiment_name=sweep_name)["experiment"]
        search = {"experiment_ids": [exp["experiment_id"]], "filter": "tags.`scalelab.role` = 'trial'"}  # fmt: skip
        runs = _post(server.uri, "runs/search", search)["runs"]
        deleted = _post(server.uri, "runs/search", search | {"run_view_type": "DELETED_ONLY"})
    finally:
        server.stop()
    tags = [{t["key"]: t["value"] for t in run["data"]["tags"]} for run in runs]
    assert len(runs) == 2 and len({t["scalelab.trial_id"] for t in tags}) == 2  # one run each
    (first, first_tags), (second, second_tags) = sorted(
        zip(runs, tags, strict=True), key=lambda pair: parse_timestamp(pair[1]["scalelab.started"])
    )
    for run, run_tags in ((first, first_tags), (second, second_tags)):
        assert (
            abs(int(run["info"]["start_time"]) - parse_timestamp(run_tags["scalelab.started"]))
            < 3000
        )
    assert int(second["info"]["start_time"]) >= int(first["info"]["end_time"])  # it queued
    assert float(second_tags["scalelab.queued_s"]) > 0
    assert not deleted.get("runs")  # each placeholder became its trial's run, none replaced
