"""`scalelab submit/status/cancel/schema` end to end, bad input and faults (real processes)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import HERE, calls, sweep_yaml
from faults.mlflow_kit import NO_JOB_RUNNER
from typer.testing import CliRunner

from scalelab.cli.main import app
from scalelab.orchestrator.ledger import Ledger

runner = CliRunner()


def _write(tmp_path: Path, text: str, name: str = "sweep.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_schema_is_json_schema_of_the_sweep():
    result = runner.invoke(app, ["schema"])
    assert result.exit_code == 0
    schema = json.loads(result.stdout)
    assert {"name", "base", "grid", "zip", "isoflop", "variants", "backend"} <= set(
        schema["properties"]
    )


def test_bad_yaml_and_unknown_backend_exit_nonzero_naming_the_line(tmp_path, work_home):
    bad = _write(tmp_path, "name: x\nbase: {model: [1, 2}\n")
    result = runner.invoke(app, ["submit", str(bad)])
    assert result.exit_code == 2 and f"{bad}:2: malformed YAML" in result.stderr
    k8s = _write(tmp_path, sweep_yaml("k8s", backend="{kind: k8s}"), "k8s.yaml")
    result = runner.invoke(app, ["submit", str(k8s)])
    assert result.exit_code == 2 and "backend.kind" in result.stderr and "'slurm'" in result.stderr


def test_two_errors_in_a_sweep_file_both_reported_exit_2(tmp_path, work_home):
    text = sweep_yaml("twoerr", backend="{kind: local}").replace("backend:", "backnd:", 1)
    path = _write(tmp_path, text.replace("name: twoerr", "name: twoerr\nexperimnt: e"))
    result = runner.invoke(app, ["submit", str(path), "--dry-run"])
    assert result.exit_code == 2, result.output
    assert "did you mean 'backend'?" in result.stderr
    assert "did you mean 'experiment'?" in result.stderr
    assert "Traceback" not in result.output


@pytest.mark.slow
def test_slurm_not_reachable_submits_nothing(tmp_path, work_home, sweep_name):
    backend = "{kind: slurm, allow_file_tracking: true}"  # past the tracking store's check
    path = _write(tmp_path, sweep_yaml(sweep_name, backend=backend))
    env = {"SLURM_CONF": str(tmp_path / "no-such-slurm.conf")}
    result = runner.invoke(app, ["submit", str(path)], env=env)
    assert result.exit_code == 2 and "SLURM is not reachable" in result.stderr
    assert Ledger(sweep_name).experiment_id() is None  # nothing half-submitted


def test_submit_status_dry_run_round_trip(tmp_path, ray_session, work_home, sweep_name):
    path = _write(tmp_path, sweep_yaml(sweep_name, seeds=2))
    plan = json.loads(runner.invoke(app, ["submit", str(path), "--dry-run", "--json"]).stdout)
    assert [t["status"] for t in plan["trials"]] == ["NEW", "NEW"]
    assert sorted((t["name"], t["swept"]["seed"]) for t in plan["trials"]) == [
        ("dense-nano-s0", 0),
        ("dense-nano-s1", 1),
    ]  # fmt: skip  (what tells the trials apart)
    assert all(t["params"] > 0 and t["tokens"] == 4096 and t["flops"] > 0 for t in plan["trials"])
    result = runner.invoke(app, ["submit", str(path), "--job", "jobs_for_tests:count"])
    assert result.exit_code == 0, result.output
    plan = json.loads(runner.invoke(app, ["submit", str(path), "--dry-run", "--json"]).stdout)
    assert [t["status"] for t in plan["trials"]] == ["FINISHED", "FINISHED"]
    status = json.loads(runner.invoke(app, ["status", sweep_name, "--json"]).stdout)
    assert sorted(t["trial_id"] for t in status["trials"]) == sorted(
        t["trial_id"] for t in plan["trials"]
    )
    assert all(t["status"] == "FINISHED" and t["attempts"] == 1 for t in status["trials"])
    table = runner.invoke(app, ["status", sweep_name])
    assert table.exit_code == 0 and "FINISHED" in table.stdout
    assert runner.invoke(app, ["status", "no-such-sweep"]).exit_code == 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _answers(uri: str) -> bool:
    try:
        urllib.request.urlopen(uri + "/health", timeout=1)
        return True
    except OSError:
        return False


@pytest.mark.slow
def test_mlflow_server_down_at_submit(tmp_path, work_home, sweep_name, empty_store):
    port, db = _free_port(), tmp_path / "server.db"
    empty_store(db)  # the server opens it instead of creating it: its start is shorter
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
         "--backend-store-uri", f"sqlite:///{db}", "--workers", "1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        env=os.environ | NO_JOB_RUNNER,
    )  # fmt: skip
    uri = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                urllib.request.urlopen(uri + "/health", timeout=1)
                break
            except OSError:
                assert time.monotonic() < deadline, "mlflow server did not start"
                time.sleep(0.5)
        path = _write(tmp_path, sweep_yaml(sweep_name))
        up = runner.invoke(
            app, ["submit", str(path), "--dry-run", "--json"], env={"MLFLOW_TRACKING_URI": uri}
        )
        assert up.exit_code == 0 and json.loads(up.stdout)["trials"][0]["status"] == "NEW"
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
    deadline = time.monotonic() + 30  # its workers may answer a moment longer than it lives
    while _answers(uri) and time.monotonic() < deadline:
        time.sleep(0.2)
    down = runner.invoke(app, ["submit", str(path)], env={"MLFLOW_TRACKING_URI": uri})
    assert down.exit_code == 2
    assert "not reachable" in down.stderr and "nothing submitted" in down.stderr
    from mlflow import MlflowClient

    assert MlflowClient(f"sqlite:///{db}").get_experiment_by_name(sweep_name) is None


@pytest.mark.slow
def test_kill_9_the_driver_then_resubmit_picks_up(
    tmp_path, ray_session, work_home, sweep_name, trial_sleep
):
    backend = "{concurrency: 1, cpus_per_trial: 0.5, retry_backoff_s: 0.1}"
    path = _write(tmp_path, sweep_yaml(sweep_name, seeds=3, backend=backend))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
        "SCALELAB_TEST_SLEEP": "1.5",
    }
    driver_log = tmp_path / "driver.log"
    with driver_log.open("wb") as log:
        driver = subprocess.Popen(
            [sys.executable, "-m", "scalelab.cli.main", "submit", str(path), "--job", "jobs_for_tests:sleepy"],
            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    deadline = time.monotonic() + 120
    finished: list[str] = []
    while not finished:
        assert driver.poll() is None, (
            f"the driver ended (exit {driver.returncode}) before it could be killed:\n"
            + driver_log.read_text(errors="replace")[-3000:]
        )
        assert time.monotonic() < deadline, "no trial finished"
        time.sleep(0.3)
        ledger = Ledger(sweep_name)
        if ledger.experiment_id() is not None:
            finished = [t for t, s in ledger.statuses().items() if s == "FINISHED"]
    os.killpg(driver.pid, signal.SIGKILL)
    driver.wait()
    before = Ledger(sweep_name).records()
    assert len(before) == 3 and any(r.status != "FINISHED" for r in before.values())

    trial_sleep(0.2)
    result = runner.invoke(app, ["submit", str(path), "--job", "jobs_for_tests:sleepy"])
    assert result.exit_code == 0, result.output
    after = Ledger(sweep_name).records()
    had_started = {t: r.run_id for t, r in before.items() if r.launched}
    assert {t: after[t].run_id for t in had_started} == had_started  # a trial keeps its run
    assert set(after) == set(before) and all(r.launched for r in after.values())
    assert set(r.status for r in after.values()) == {"FINISHED"}
    for tid in finished:  # finished before the kill: not run again
        assert calls(work_home, after[tid].run_id, "start") == 1


def test_status_watch_refreshes_until_every_trial_is_done(
    tmp_path, ray_session, work_home, sweep_name, trial_sleep
):
    import threading

    from scalelab.orchestrator.plan.expand import expand
    from scalelab.orchestrator.plan.spec import parse_spec
    from scalelab.orchestrator.scheduler import run_sweep

    trial_sleep(1)
    spec, source = parse_spec(sweep_yaml(sweep_name, seeds=3))  # concurrency 2: two rounds
    trials = expand(spec, source)
    ledger = Ledger(spec.name)
    ledger.sync(spec, trials)  # the sweep exists before status looks for it
    driver = threading.Thread(
        target=run_sweep, args=(spec, trials, ledger), kwargs={"job": "jobs_for_tests:sleepy"}
    )
    driver.start()
    try:
        result = runner.invoke(app, ["status", sweep_name, "--watch", "--interval", "0.3"])
        statuses_at_return = set(Ledger(sweep_name).statuses().values())
    finally:
        driver.join(timeout=60)
    assert result.exit_code == 0, result.output
    assert statuses_at_return == {"FINISHED"}  # it returned only once every trial was done
    assert "3/3 done: 3 finished" in result.stdout
    assert result.stdout.count("FINISHED") >= 3


def test_submit_into_a_log_file_says_it_started_and_gives_counts_while_it_runs(
    tmp_path, ray_session, work_home, sweep_name, trial_sleep, monkeypatch
):
    """Output that is not a terminal (`submit > log`, nohup; CliRunner's too) gets no drawn
    progress bar until the end: a line says the sweep started and the counts follow."""
    from scalelab.cli import sweep_watch

    monkeypatch.setattr(sweep_watch, "PLAIN_EVERY_S", 0.5)
    trial_sleep(2.0)
    path = _write(tmp_path, sweep_yaml(sweep_name, seeds=2, backend="{concurrency: 1}"))
    result = runner.invoke(app, ["submit", str(path), "--job", "jobs_for_tests:sleepy"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    started = [i for i, line in enumerate(lines) if "of 2 trials to run" in line]
    counts = [i for i, line in enumerate(lines) if "/2 done," in line and "running" in line]
    ended = [i for i, line in enumerate(lines) if line.startswith("dense-nano-s")]
    assert started and counts and ended, result.output
    assert started[0] < counts[0] < ended[0]  # heard from before the first trial ended
