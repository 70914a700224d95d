"""MLflow tracking through the outbox: real sqlite store and a real `mlflow server` that is
stopped mid-run and started again. Nothing is lost, logging never blocks."""

import json
import os
import time

import pytest
from faults.mlflow_kit import MlflowServer
from mlflow.tracking import MlflowClient

from scalelab.contract.workdir import CURVES_FILE
from scalelab.jobs.tracking.provenance import PARAM_VALUE_LIMIT, flatten
from scalelab.jobs.tracking.tracker import FINISH_TIMEOUT_VAR, Tracker, deliver_outbox


def _new_run(uri: str) -> str:
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("tests-tracking") or client.create_experiment(
        "tests-tracking"
    )
    exp_id = exp if isinstance(exp, str) else exp.experiment_id
    return client.create_run(exp_id).info.run_id


def _steps(uri: str, run_id: str, key: str) -> list[int]:
    return sorted(m.step for m in MlflowClient(uri).get_metric_history(run_id, key))


def test_flatten_respects_param_limits():
    flat = flatten({"model": {"size": "nano", "budget": None}, "data": {"note": "x" * 9000}})
    assert flat["model.size"] == "nano" and flat["model.budget"] == "null"
    assert len(flat["data.note"]) == PARAM_VALUE_LIMIT


def test_sqlite_store_and_outbox_delivered_later(home, mlflow_uri, tmp_path, monkeypatch):
    run_id = _new_run(mlflow_uri)
    trial = tmp_path / "trial"
    # First attempt: the tracking server is unreachable; points stay in the outbox.
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:9")
    monkeypatch.setenv(FINISH_TIMEOUT_VAR, "1")  # the job's wait for MLflow: 1 s, not 30
    tracker = Tracker(trial, enabled=True, flush_interval_s=0.1)
    tracker.start(run_id, "tests-tracking", "r", {"scalelab.trial_id": "t1"}, {"a.b": "1"})
    for step in range(1, 31):
        tracker.log(step, step * 10, step * 1e9, {"train/loss": 1.0 / step, "train/lr": 0.1})
    started = time.monotonic()
    assert tracker.finish(None) is False  # not delivered, not lost
    assert time.monotonic() - started < 20  # the variable's wait, not the default 30 s
    assert tracker.pending() > 0
    assert _steps(mlflow_uri, run_id, "train/loss") == []
    rows = [json.loads(line) for line in (trial / CURVES_FILE).read_text().splitlines()]
    assert len(rows) == 60 and {r["metric"] for r in rows} == {"train/loss", "train/lr"}

    # The store is reachable again: a resumed tracker (or deliver_outbox) sends the rest.
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_uri)
    started = time.monotonic()
    assert deliver_outbox(trial, run_id) > 60
    # not minutes behind finish()'s takeover, retrying the dead server with MLflow's backoff
    assert time.monotonic() - started < 60
    assert deliver_outbox(trial, run_id) == 0  # delivered once, not twice
    assert _steps(mlflow_uri, run_id, "train/loss") == list(range(1, 31))
    run = MlflowClient(mlflow_uri).get_run(run_id)
    assert run.data.tags["scalelab.trial_id"] == "t1" and run.data.params["a.b"] == "1"
    assert run.info.status == "RUNNING"  # finish(None): left running for the requeue


def test_a_tracker_that_gave_up_sends_nothing_after_finish(home, mlflow_uri, tmp_path, monkeypatch):
    """finish() returns once its time is up, and nothing of that tracker sends afterwards:
    its last delivery waited on the spool's lock (another process sending) and, once it got
    the lock, sent to whatever MLFLOW_TRACKING_URI had become, behind the back of whoever
    delivers next (their deliver_outbox found nothing to send)."""
    import fcntl

    run_id = _new_run(mlflow_uri)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:9")  # unreachable
    tracker = Tracker(tmp_path / "trial", enabled=True, flush_interval_s=0.1)
    tracker.start(run_id, "tests-tracking", "r", {"scalelab.trial_id": "t3"}, {})
    tracker.log(1, 10, 1e9, {"train/loss": 1.0})
    with open(tracker.outbox.dir / "lock", "w") as held:  # another process is sending it
        fcntl.flock(held, fcntl.LOCK_EX)
        assert tracker.finish(None, timeout_s=1) is False
        monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_uri)
    time.sleep(2)
    assert tracker.pending() > 0 and _steps(mlflow_uri, run_id, "train/loss") == []
    assert deliver_outbox(tmp_path / "trial", run_id) > 0  # left for whoever comes next
    assert _steps(mlflow_uri, run_id, "train/loss") == [1]


@pytest.mark.parametrize("value", ["soon", "-1", "nan"])
def test_a_bad_finish_timeout_stops_the_tracker_before_it_starts(value, tmp_path, monkeypatch):
    monkeypatch.setenv(FINISH_TIMEOUT_VAR, value)
    with pytest.raises(ValueError, match=f"{FINISH_TIMEOUT_VAR}=.*seconds >= 0"):
        Tracker(tmp_path / "trial", enabled=True)


def test_a_refused_param_never_costs_the_points(home, mlflow_uri, tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_uri)
    run_id = _new_run(mlflow_uri)
    MlflowClient(mlflow_uri).log_param(run_id, "model.bias", "True")  # another writer's style
    tracker = Tracker(tmp_path / "trial", enabled=True, flush_interval_s=0.1)
    tracker.start(
        run_id, "tests-tracking", "r", {"scalelab.trial_id": "t2"}, {"model.bias": "true"}
    )
    for step in range(1, 6):
        tracker.log(step, step, float(step), {"train/loss": 1.0 / step})
    assert tracker.finish("FINISHED", timeout_s=30) is True
    run = MlflowClient(mlflow_uri).get_run(run_id)
    assert _steps(mlflow_uri, run_id, "train/loss") == [1, 2, 3, 4, 5]
    assert run.data.tags["scalelab.trial_id"] == "t2" and run.info.status == "FINISHED"
    assert run.data.params["model.bias"] == "True"  # MLflow keeps the first value


def test_a_damaged_spool_line_is_set_aside_and_the_rest_delivered(home, mlflow_uri, tmp_path):
    from scalelab.jobs.tracking.outbox import Outbox

    run_id = _new_run(mlflow_uri)
    outbox = Outbox(tmp_path / "trial", run_id)
    point = {"kind": "metric", "key": "train/loss", "value": 1.0, "tokens": 1, "ts": 1}
    outbox.append([point | {"step": 1}])
    with open(outbox.path, "a") as f:
        f.write('{"kind": "metric", "key": \x00\n')  # e.g. a bad sector
    outbox.append([point | {"step": 2, "tokens": 2}, {"kind": "status", "status": "FINISHED"}])
    assert outbox.deliver() == 4 and outbox.pending() == 0
    assert _steps(mlflow_uri, run_id, "train/loss") == [1, 2]
    assert MlflowClient(mlflow_uri).get_run(run_id).info.status == "FINISHED"
    assert "not a spool line" in (outbox.dir / "rejected.jsonl").read_text()
    assert outbox.positions() == {"train/loss": 2}


def test_params_are_flattened_with_json_leaves():
    from scalelab.jobs.config import JobConfig
    from scalelab.jobs.tracking.provenance import mlflow_params

    job = JobConfig(model={"size": "nano", "vocab_size": 256}, train={"tokens": 1000})
    params = mlflow_params(job)
    assert "model.budget" not in params and params["model.bias"] == "true"  # no nulls
    assert params["train.tokens"] == "1000" and params["model.size"] == "nano"


def test_invalid_metric_name_is_refused_at_once(tmp_path):
    tracker = Tracker(tmp_path, enabled=True)
    tracker._outbox = tracker._curves = open(os.devnull, "w")
    with pytest.raises(ValueError, match="not a valid MLflow metric name"):
        tracker.log(1, 1, 1.0, {"val/loss@gflop": 1.0})


@pytest.mark.slow
def test_real_server_stopped_mid_run_loses_nothing(tmp_path, monkeypatch, mlflow_uri):
    server = MlflowServer(mlflow_uri).start()
    uri = server.uri
    try:
        monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
        tracker = Tracker(tmp_path / "trial", enabled=True, flush_interval_s=0.2)
        run_id = tracker.start(None, "tests-tracking", "live", {"k": "v"}, {"p": "1"})
        for step in range(1, 21):
            tracker.log(step, step, float(step), {"train/loss": float(step)})
        deadline = time.time() + 30
        while tracker.pending() and time.time() < deadline:
            time.sleep(0.1)
        assert tracker.pending() == 0

        server.stop()
        slowest = 0.0
        for step in range(21, 41):  # the server is down: logging must not block
            t = time.perf_counter()
            tracker.log(step, step, float(step), {"train/loss": float(step)})
            slowest = max(slowest, time.perf_counter() - t)
        deadline = time.time() + 15  # the sender's next try (later under load)
        while not tracker.last_error and time.time() < deadline:
            time.sleep(0.1)
        assert tracker.pending() > 0 and tracker.last_error  # spooled, send failed
        assert slowest < 0.05

        server.start()  # the same port
        assert tracker.finish("FINISHED", timeout_s=60) is True
        assert _steps(uri, run_id, "train/loss") == list(range(1, 41))
        assert MlflowClient(uri).get_run(run_id).info.status == "FINISHED"
    finally:
        server.stop()


def test_tracking_off_keeps_every_point_in_the_curves_and_touches_no_store(tmp_path, monkeypatch):
    """SCALELAB_TRACKING=off (a Python without MLflow: the GPU acceptance run on a node's own
    interpreter): the curves get every point, a resume still cuts them back, and no run,
    spool or sender exists; any other value stops the tracker before it starts."""
    monkeypatch.setenv("SCALELAB_TRACKING", "off")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:9")  # nothing listens there
    trial = tmp_path / "trial"
    tracker = Tracker(trial, enabled=True)
    assert tracker.start(None, "exp", "run", {"k": "v"}, {"p": "1"}) is None
    for step in (1, 2, 3):
        tracker.log(step, 100 * step, 1e6 * step, {"train/loss": 4.0 - step})
    tracker.set_tag("scalelab.note", "x")
    assert tracker.finish("FINISHED") and tracker.pending() == 0
    again = Tracker(trial, enabled=True)
    again.start(None, "exp", "run", {}, {}, resume_tokens=200)
    again.log(3, 300, 3e6, {"train/loss": 0.5})
    again.finish("FINISHED")
    rows = [json.loads(line) for line in (trial / CURVES_FILE).read_text().splitlines()]
    assert [(r["tokens"], r["value"]) for r in rows] == [(100, 3.0), (200, 2.0), (300, 0.5)]
    assert sorted(p.name for p in trial.iterdir()) == [CURVES_FILE]  # no spool, no run
    monkeypatch.setenv("SCALELAB_TRACKING", "maybe")
    with pytest.raises(ValueError, match="SCALELAB_TRACKING='maybe'"):
        Tracker(trial, enabled=True)
