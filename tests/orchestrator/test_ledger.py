"""The MLflow ledger: SCHEDULED child runs up front, no duplicates, write-once claims."""

from __future__ import annotations

import subprocess
import sys
import threading

from conftest import sweep_yaml

from orchestrator.expand import expand
from orchestrator.ledger import Ledger
from orchestrator.spec import parse_spec


def _sweep(name: str, seeds: int = 3):
    spec, source = parse_spec(sweep_yaml(name, seeds=seeds))
    return spec, expand(spec, source)


def test_sync_creates_scheduled_runs_once(work_home, sweep_name):
    spec, trials = _sweep(sweep_name)
    ledger = Ledger(spec.name)
    recs = ledger.sync(spec, trials)
    assert set(recs) == {t.trial_id for t in trials}
    run = ledger.client.get_run(recs[trials[0].trial_id].run_id)
    assert run.info.status == "SCHEDULED"
    assert run.data.tags["mlflow.parentRunId"] == ledger.parent_id
    assert run.data.tags["scalelab.variant"] == "dense" and run.data.tags["scalelab.size"] == "nano"
    assert run.data.params["model.size"] == "nano"
    again = Ledger(spec.name).sync(spec, trials)  # a second driver, later
    assert {t: r.run_id for t, r in again.items()} == {t: r.run_id for t, r in recs.items()}
    parent = ledger.client.get_run(ledger.parent_id)
    assert parent.info.run_name == f"sweep:{spec.name}"


def test_concurrent_syncs_leave_one_run_per_trial(work_home, sweep_name):
    spec, trials = _sweep(sweep_name, seeds=4)
    results = {}

    def drive(i: int) -> None:
        results[i] = Ledger(spec.name).sync(spec, trials)

    threads = [threading.Thread(target=drive, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert {t: r.run_id for t, r in results[0].items()} == {
        t: r.run_id for t, r in results[1].items()
    }
    ledger = Ledger(spec.name)
    runs = ledger._search(
        f"tags.`scalelab.sweep` = '{spec.name}' and tags.`scalelab.role` = 'trial'"
    )
    assert len(runs) == len(trials)  # the losers' runs were deleted
    parents = ledger._search(
        f"tags.`scalelab.sweep` = '{spec.name}' and tags.`scalelab.role` = 'sweep'"
    )
    assert len(parents) == 1


def test_only_one_driver_wins_a_claim(work_home, sweep_name):
    spec, trials = _sweep(sweep_name, seeds=1)
    a, b = Ledger(spec.name), Ledger(spec.name)
    rec = a.sync(spec, trials)[trials[0].trial_id]
    a.heartbeat()
    b.find_parent()
    rec_b = b.record(rec.run_id)
    assert a.claim(rec)
    assert not b.claim(rec_b)  # a is alive: b backs off
    # b raced on a stale view of the run (it did not see a's claim): the store refuses it
    stale = b.record(rec.run_id)
    stale.params = {}
    assert not b.claim(stale)
    assert a.record(rec.run_id).claim == (0, a.driver_id)


def test_a_dead_drivers_claim_lapses(work_home, sweep_name):
    spec, trials = _sweep(sweep_name, seeds=1)
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    pid = int(dead.stdout)  # a process that has exited
    import socket

    ghost = Ledger(spec.name, driver_id=f"{socket.gethostname()}:{pid}:abcdef")
    rec = ghost.sync(spec, trials)[trials[0].trial_id]
    ghost.heartbeat()
    assert ghost.claim(rec)
    alive = Ledger(spec.name)
    alive.find_parent()
    fresh = alive.record(rec.run_id)
    assert alive.claim(fresh)
    assert alive.record(rec.run_id).claim == (1, alive.driver_id)
