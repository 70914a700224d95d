"""A driver lets a trial go while its `mlflow server` is stopped: the release returns at
once (the scheduler's loop goes on sending spools and polling), and is written at the
driver's next heartbeat once the server is back, so another sweep claims the trial then
rather than when this driver ends."""

from __future__ import annotations

import threading
import time

from faults.mlflow_kit import MlflowServer, sweep_yaml

from scalelab.orchestrator.ledger import Ledger
from scalelab.orchestrator.plan.expand import expand
from scalelab.orchestrator.plan.spec import parse_spec

FAST_S = 2.0  # MLflow's own retry chain sleeps 2 s, then 4 s, ... before giving up


def _ledger(name: str, uri: str) -> tuple[Ledger, str]:
    spec, source = parse_spec(sweep_yaml(name, seeds=1))  # both sweeps list one trial
    (trial,) = expand(spec, source)
    ledger = Ledger(spec.name, tracking_uri=uri)
    ledger.sync(spec, [trial])
    ledger.heartbeat()
    return ledger, trial.trial_id


def _seconds_to_return(call) -> float:
    """How long `call()` takes (inf: still going after 3 * FAST_S, in a thread left behind)."""
    started = time.monotonic()
    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(3 * FAST_S)
    return float("inf") if thread.is_alive() else time.monotonic() - started


def test_a_release_during_an_outage_returns_at_once_and_is_written_when_the_store_is_back(
    tmp_path, empty_store, monkeypatch
):
    monkeypatch.setenv("SCALELAB_HOME", str(tmp_path / "home"))
    server = MlflowServer(empty_store(tmp_path / "server.db")).start()
    try:
        holder, tid = _ledger("release-a", server.uri)
        other, same = _ledger("release-b", server.uri)
        assert same == tid
        assert holder.claim_trials([tid]) == {tid: None}
        assert other.claim_trials([tid]) == {tid: "release-a"}  # held by a live driver

        server.stop()
        assert _seconds_to_return(lambda: holder.release_trial(tid)) < FAST_S
        server.start()
        assert other.claim_trials([tid]) == {tid: "release-a"}  # not written yet
        holder.heartbeat(poll=True)  # the scheduler's periodic beat
        assert other.claim_trials([tid]) == {tid: None}  # let go: claimed at once
        assert holder.claim_trials([tid]) == {tid: "release-b"}
    finally:
        server.stop()
