"""A trial that finishes while MLflow is unreachable: every point arrives later, sent by
whoever touches the trial next, and its run turns FINISHED only once they have arrived.
The driver's periodic polls fail at once during the outage, so it acts within seconds of
the server's return."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from faults.mlflow_kit import (
    MlflowServer,
    curve_points,
    env,
    mlflow_points,
    repeated,
    scalelab,
    sweep_yaml,
)

from scalelab.jobs.tracking.tracker import FINISH_TIMEOUT_VAR
from scalelab.orchestrator.ledger import Ledger, LedgerUnavailable
from scalelab.orchestrator.plan.expand import expand
from scalelab.orchestrator.plan.spec import parse_spec

# The job waits FINISH_WAIT_S for MLflow at its end (30 s by default: the window the outage
# of issue 17 outlasted); the outage outlasts that wait several times over.
FINISH_WAIT_S = 5
OUTAGE_S = 15
# From the server's return to the run's FINISHED (MLflow's retry chain made it anything up
# to a minute, by where in its chain the server came back)
REACT_S = 15
FAST_S = 2.0  # a poll while the server is down (MLflow's chain sleeps 4 s before its 2nd retry)
STEPS = 40


def _quick_finish(environ: dict[str, str], wait_s: float = FINISH_WAIT_S) -> dict[str, str]:
    return environ | {FINISH_TIMEOUT_VAR: str(wait_s)}


def _expected(home: Path, trial_id: str) -> dict[str, list[tuple[int, float]]]:
    """What MLflow must hold: every finite point of curves.jsonl, once."""
    out: dict[str, list[tuple[int, float]]] = {}
    for p in curve_points(home, trial_id):
        if p["value"] == p["value"]:
            out.setdefault(p["metric"], []).append((p["step"], p["value"]))
    return {k: sorted(v) for k, v in out.items()}


def _result(home: Path, trial_id: str) -> dict:
    return json.loads((home / "trials" / trial_id / "result.json").read_text())


def _seconds_to_fail(poll: Callable[[], object]) -> float:
    """How long `poll()` takes to raise LedgerUnavailable (inf: still going after 3 *
    FAST_S, in a thread left behind)."""
    raised: list[BaseException] = []

    def call() -> None:
        try:
            poll()
        except BaseException as e:  # noqa: BLE001 - what it raised is what is checked
            raised.append(e)

    started = time.monotonic()
    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(3 * FAST_S)
    if thread.is_alive():
        return float("inf")
    assert raised and isinstance(raised[0], LedgerUnavailable), raised
    return time.monotonic() - started


def _wait_for(predicate, timeout_s: float, what: str, driver: subprocess.Popen) -> None:
    deadline = time.time() + timeout_s
    while not predicate():
        assert driver.poll() is None, (
            f"the driver exited waiting for {what}: " + (driver.stderr.read()[-3000:])
        )
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.mark.slow
def test_a_driver_sends_what_an_outage_held_back_then_marks_finished(tmp_path, empty_store):
    """`scalelab submit` on a real `mlflow server`, stopped while the trial ends, for at
    least OUTAGE_S and until the job has given up waiting for MLflow and returned."""
    home = tmp_path / "home"
    server = MlflowServer(empty_store(tmp_path / "server.db")).start()
    try:
        sweep = tmp_path / "sweep.yaml"
        sweep.write_text(sweep_yaml("outage", seeds=1, steps=STEPS))
        (trial,) = expand(*parse_spec(sweep.read_text(), str(sweep)))
        driver = subprocess.Popen(
            [sys.executable, "-m", "scalelab.cli.main", "submit", str(sweep), "--no-summary"],
            env=_quick_finish(env(home, server.uri)),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        curves = home / "trials" / trial.trial_id / "curves.jsonl"
        _wait_for(
            lambda: curves.exists() and '"step": 2,' in curves.read_text(), 600, "step 2", driver
        )
        polls = Ledger("outage", tracking_uri=server.uri)  # the driver's, as it polls
        polls.experiment_id()
        server.stop()
        stopped = time.time()
        assert _seconds_to_fail(polls.cancelled_run_ids) < FAST_S  # the next tick asks again
        # training ends, the job waits FINISH_WAIT_S for MLflow, leaves the rest spooled and
        # returns (result.json); the outage lasts until then, and at least OUTAGE_S
        result = home / "trials" / trial.trial_id / "result.json"
        _wait_for(result.exists, 600, "the job to end during the outage", driver)
        time.sleep(max(0.0, stopped + OUTAGE_S - time.time()))
        server.start()
        back = time.time()

        total = len(_expected(home, trial.trial_id)["train/loss"])
        ledger = Ledger("outage", tracking_uri=server.uri)
        run_id = ledger.records()[trial.trial_id].run_id
        seen, finished_at = [], None
        while driver.poll() is None:  # FINISHED never shows while points are missing
            status = ledger.client.get_run(run_id).info.status
            n = len(mlflow_points(server.uri, run_id).get("train/loss", []))
            seen.append((status, n))
            assert status != "FINISHED" or n == total, seen
            if status == "FINISHED" and finished_at is None:
                finished_at = time.time()
            time.sleep(0.2)
        finished_at = finished_at or time.time()  # the driver ended between two looks
        out, err = driver.communicate()
        assert driver.returncode == 0, err[-3000:]
        assert _result(home, trial.trial_id)["metrics_pending"] > 0  # the outage was real

        sent = mlflow_points(server.uri, run_id)
        assert sent == _expected(home, trial.trial_id)
        assert all(repeated(points) == [] for k, points in sent.items() if "gflop" not in k)
        assert sent["val/loss"][-1][1] == _result(home, trial.trial_id)["final_val_loss"]
        assert ledger.client.get_run(run_id).info.status == "FINISHED"
        # the driver's polls fail fast during the outage and its sends retry every few
        # seconds: it acts soon after the server is back, not after MLflow's back-off
        reacted_s = finished_at - back
        assert reacted_s < REACT_S, f"FINISHED {reacted_s:.0f} s after the server came back"
    finally:
        server.stop()


def _trained_unreachable(root: Path, name: str, text: str, empty_store) -> tuple:
    """Record the one-trial sweep `text` in root/home's sqlite store, then train its trial
    with MLflow unreachable (a closed port): everything the job logs waits in the run's
    spool. Returns (home, trial, ledger, run id, the job's exit code)."""
    home = root / "home"
    home.mkdir()
    (root / "sweep.yaml").write_text(text)
    spec, source = parse_spec(text)
    (trial,) = expand(spec, source)
    ledger = Ledger(name, tracking_uri=empty_store(home / "mlflow.db"))
    run_id = ledger.sync(spec, [trial])[trial.trial_id].run_id
    (root / "job.json").write_text(trial.job.model_dump_json())
    job = subprocess.run(
        [sys.executable, "-m", "scalelab.jobs.training.train", str(root / "job.json"), run_id],
        env=_quick_finish(env(home, "http://127.0.0.1:9"), 1), capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip
    assert mlflow_points(ledger.uri, run_id) == {}, job.stderr[-3000:]  # MLflow saw nothing
    return home, trial, ledger, run_id, job.returncode


@pytest.fixture(scope="module")
def spooled_home(tmp_path_factory, empty_store) -> tuple[Path, str, str]:
    """A work directory whose one trial trained to the end while its job could not reach
    MLflow: everything it logged waits in the run's spool. Returns (home, trial id, run
    id); the sweep's ledger is the home's sqlite store."""
    root = tmp_path_factory.mktemp("spooled")
    text = sweep_yaml("spooled", seeds=1)
    home, trial, ledger, run_id, code = _trained_unreachable(root, "spooled", text, empty_store)
    assert code == 0
    assert ledger.client.get_run(run_id).info.status == "SCHEDULED"
    return home, trial.trial_id, run_id


def _copy(spooled: tuple[Path, str, str], tmp_path: Path) -> tuple[Path, Ledger]:
    home = tmp_path / "home"
    shutil.copytree(spooled[0], home)
    shutil.copy(spooled[0].parent / "sweep.yaml", tmp_path / "sweep.yaml")
    return home, Ledger("spooled", tracking_uri=f"sqlite:///{home / 'mlflow.db'}")


def _assert_delivered(home: Path, ledger: Ledger, trial_id: str, run_id: str) -> None:
    sent = mlflow_points(ledger.uri, run_id)
    assert sent == _expected(home, trial_id)
    assert sent["val/loss"][-1][1] == _result(home, trial_id)["final_val_loss"]
    assert ledger.client.get_run(run_id).info.status == "FINISHED"


@pytest.mark.slow
def test_status_sends_the_spool(spooled_home, tmp_path):
    home, ledger = _copy(spooled_home, tmp_path)
    _, trial_id, run_id = spooled_home
    shown = scalelab("status", "spooled", "--json", home=home)
    assert shown.returncode == 0, shown.stderr[-3000:]
    assert json.loads(shown.stdout)["trials"][0]["status"] == "FINISHED"
    _assert_delivered(home, ledger, trial_id, run_id)


@pytest.mark.slow
def test_results_sync_sends_the_spool(spooled_home, tmp_path):
    home, ledger = _copy(spooled_home, tmp_path)
    _, trial_id, run_id = spooled_home
    synced = scalelab("results", "sync", "spooled", home=home)
    assert synced.returncode == 0, synced.stderr[-3000:]
    _assert_delivered(home, ledger, trial_id, run_id)


@pytest.mark.slow
def test_a_later_driver_sends_the_spool_and_does_not_train_again(spooled_home, tmp_path):
    home, ledger = _copy(spooled_home, tmp_path)
    _, trial_id, run_id = spooled_home
    trial_files = sorted(
        p for p in (home / "trials" / trial_id).rglob("*") if "outbox" not in str(p)
    )
    before = {p: p.read_bytes() for p in trial_files if p.is_file()}
    again = scalelab("submit", str(tmp_path / "sweep.yaml"), "--no-summary", home=home)
    assert again.returncode == 0, again.stderr[-3000:]
    _assert_delivered(home, ledger, trial_id, run_id)
    after = {p: p.read_bytes() for p in trial_files if p.is_file()}
    assert after == before  # no checkpoint, curve point or result written: not trained again
    assert ledger.record(run_id).attempts == 0


@pytest.mark.slow
def test_a_resubmit_sends_the_spool_of_a_failed_trial_it_does_not_run_again(tmp_path, empty_store):
    """Issue 33, item 8: a trial that failed (here: diverged) out of retries while its job
    could not reach MLflow kept its points spooled through every later submit (0 of 74 in
    MLflow, until `scalelab status` sent them)."""
    text = sweep_yaml("failed-spool", seeds=1).replace(
        "log_interval: 1,", "log_interval: 1, lr: 1.0e+3,"
    )
    home, trial, ledger, run_id, code = _trained_unreachable(
        tmp_path, "failed-spool", text, empty_store
    )
    assert code == 1
    assert _result(home, trial.trial_id)["diverged"] is True
    # the driver of that attempt reached MLflow (its job did not) and recorded its end
    ledger.started(ledger.record(run_id), 1)
    ledger.set_status(run_id, "FAILED")

    again = scalelab("submit", str(tmp_path / "sweep.yaml"), "--no-summary", home=home)
    assert again.returncode == 0, again.stderr[-3000:]
    sent = {k: [p for p in v if p[1] == p[1]] for k, v in mlflow_points(ledger.uri, run_id).items()}
    assert sent == _expected(home, trial.trial_id) and sent["train/loss"]
    rec = ledger.record(run_id)
    assert rec.attempts == 1 and rec.status == "FAILED"  # not run again
    assert rec.tags["scalelab.diverged"] == "1"  # the job's own tags arrived too
