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
from scalelab.orchestrator.expand import expand
from scalelab.orchestrator.ledger import Ledger
from scalelab.orchestrator.spec import parse_spec

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


def _in_a_browser(server: MlflowServer, experiment_id: str) -> None:
    """What a first visit shows, through headless Chromium where the machine has one, logged
    in as the owner answers the login prompt: the saved view of the trials, in model training
    mode, with no workflowType in the address (as from the experiments list). Without
    Chromium, only the page and tags are checked."""
    if browser.chromium() is None:
        warnings.warn(
            "no Chromium (apt-get install chromium): the UI is not opened in a browser",
            stacklevel=2,
        )
        return
    url = f"{server.uri}/#/experiments/{experiment_id}/runs?viewStateShareKey=scalelab-trials"
    showing = ("dense-nano-lr0.001", "Group: dense")
    dom = browser.page_after_login(url, *server.login(), showing=showing)
    found = {text: text in dom for text in showing}
    assert all(found.values()), found  # the trials' table, grouped by variant
    assert "Detect issues" not in dom  # not the GenAI overview


@pytest.mark.slow
def test_what_the_mlflow_ui_shows(tmp_path, ray_session, work_home, sweep_name):
    text = sweep_yaml(sweep_name, seeds=1, backend=ONCE).replace(
        "grid:", "description: lr sweep of the nano model\ngrid:\n  train.lr: [0.001, 0.003]"
    )
    launched = int(time.time() * 1000)
    result = runner.invoke(app, ["submit", str(_write(tmp_path, text)), "--job", "jobs_for_tests:count"])  # fmt: skip
    assert result.exit_code == 0, result.output
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
        page_request = urllib.request.Request(f"{server.uri}/", headers=login)
        with urllib.request.urlopen(page_request, timeout=30) as page:
            assert b'"mlflow.workflowType_v1"' in page.read()  # model training by default
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
