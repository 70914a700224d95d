"""Two sweeps listing the same trial, submitted at once by two real driver processes (real
Ray, real MLflow, the real training job held at its third step: jobs_for_tests.held_training):
the trial is trained once, the other sweep waits for it and copies its curve; a claimant
killed with SIGKILL loses the trial to the other sweep, which trains it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from conftest import HERE, calls, sweep_yaml
from faults.mlflow_kit import mlflow_points
from jobs_for_tests import HOLD_FILE

from scalelab.orchestrator.ledger import Ledger

JOB = "jobs_for_tests:held_training"
WAITING = "scalelab.waiting_for"
STEPS = 8  # conftest's tiny sweep: 4,096 tokens in batches of 512, each logged here


def _start(tmp_path: Path, name: str, seed: int) -> tuple[subprocess.Popen, Path]:
    path = tmp_path / f"{name}.yaml"
    backend = "{concurrency: 1, cpus_per_trial: 0.5, retry_backoff_s: 0.1}"
    text = sweep_yaml(name, seeds=1, first_seed=seed, backend=backend)
    path.write_text(
        text.replace("global_batch_tokens: 512", "global_batch_tokens: 512, log_interval: 1")
    )
    return start_driver(path, tmp_path / f"{name}.log", JOB)


def start_driver(path: Path, log: Path, job: str) -> tuple[subprocess.Popen, Path]:
    """`scalelab submit PATH --job JOB` in a process group of its own (so a test can kill
    the driver and its children at once), its output in `log`."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
    }
    with log.open("wb") as out:
        driver = subprocess.Popen(
            [sys.executable, "-m", "scalelab.cli.main", "submit", str(path), "--job", job,
             "--no-summary"],
            env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    return driver, log


def _run(name: str):
    """The sweep's one trial run, or None before its placeholder exists."""
    try:
        records = Ledger(name).records()
    except Exception:  # the sweep's experiment or parent run is not there yet
        return None
    return next(iter(records.values()), None)


def _until(what: str, ready, drivers, deadline_s: float = 150.0) -> None:
    deadline = time.monotonic() + deadline_s
    while not ready():
        for driver, log in drivers:
            assert driver.poll() is None, log.read_text(errors="replace")[-3000:]
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def _both_claimed_one_training(names: list[str], home: Path, drivers) -> dict[str, str]:
    """Wait until both drivers claimed their sweep's run and a training job has started;
    the run ids by sweep."""
    runs: dict[str, str] = {}

    def ready() -> bool:
        for name in names:
            rec = _run(name)
            if rec is not None and rec.claim[1] is not None:
                runs[name] = rec.run_id
        return len(runs) == 2 and any(calls(home, r, "train") for r in runs.values())

    _until("both sweeps claimed their run and one trained the trial", ready, drivers)
    return runs


def _curve_positions(trial_dir: Path) -> Counter:
    lines = (trial_dir / "curves.jsonl").read_text().splitlines()
    return Counter((p["metric"], p["tokens"]) for p in map(json.loads, lines))


@pytest.mark.slow
def test_two_sweeps_sharing_a_trial_train_it_once(tmp_path, work_home, sweep_name):
    names = [f"{sweep_name}-a", f"{sweep_name}-b"]
    hold = work_home / HOLD_FILE
    hold.touch()
    try:
        drivers = [_start(tmp_path, name, seed=8500) for name in names]
        runs = _both_claimed_one_training(names, work_home, drivers)
    finally:
        hold.unlink(missing_ok=True)
    for driver, log in drivers:
        assert driver.wait(timeout=150) == 0, log.read_text(errors="replace")[-3000:]

    started = {name: calls(work_home, run_id, "train") for name, run_id in runs.items()}
    assert sorted(started.values()) == [0, 1], started  # one training, the other waited
    trained, waited = sorted(names, key=lambda n: -started[n])
    assert "1 trained before in another sweep" in (tmp_path / f"{waited}.log").read_text()
    uri = Ledger(trained).uri
    first, second = Ledger(trained).records(), Ledger(waited).records()
    ((trial_id, rec_a),), ((_, rec_b),) = first.items(), second.items()
    assert rec_a.status == rec_b.status == "FINISHED"
    assert WAITING not in rec_b.tags  # its wait is over
    assert second[trial_id].tags["scalelab.trained_in_run"] == runs[trained]
    points = mlflow_points(uri, runs[trained])
    assert len(points["train/loss"]) == STEPS
    assert mlflow_points(uri, runs[waited]) == points
    # the training's curve file is whole: every step once, none cut away by a second start
    positions = _curve_positions(work_home / "trials" / trial_id)
    assert {n for n in positions.values()} == {1}
    assert sum(1 for metric, _ in positions if metric == "train/loss") == STEPS


@pytest.mark.slow
def test_a_claimant_killed_with_sigkill_loses_the_trial_to_the_other_sweep(
    tmp_path, work_home, sweep_name
):
    names = [f"{sweep_name}-a", f"{sweep_name}-b"]
    hold = work_home / HOLD_FILE
    hold.touch()
    try:
        drivers = dict(zip(names, (_start(tmp_path, n, seed=8510) for n in names), strict=True))
        runs = _both_claimed_one_training(names, work_home, list(drivers.values()))
        killed = next(n for n in names if calls(work_home, runs[n], "train"))
        other = next(n for n in names if n != killed)
        _until(
            "the other sweep waited for the trial or trained it",
            lambda: WAITING in _run(other).tags or calls(work_home, runs[other], "train"),
            list(drivers.values()),
        )
        assert calls(work_home, runs[other], "train") == 0  # it waits while the claimant lives
        assert _run(other).tags[WAITING] == f"sweep {killed}"
        os.killpg(drivers[killed][0].pid, signal.SIGKILL)
        drivers[killed][0].wait()
        _until(
            "the other sweep took the trial over",
            lambda: calls(work_home, runs[other], "train") == 1,
            [drivers[other]],
        )
    finally:
        hold.unlink(missing_ok=True)
    driver, log = drivers[other]
    assert driver.wait(timeout=150) == 0, log.read_text(errors="replace")[-3000:]

    (rec,) = Ledger(other).records().values()
    assert rec.status == "FINISHED" and WAITING not in rec.tags
    assert calls(work_home, runs[other], "train") == 1
    assert len(mlflow_points(Ledger(other).uri, rec.run_id)["train/loss"]) == STEPS
    positions = _curve_positions(work_home / "trials" / rec.tags["scalelab.trial_id"])
    assert {n for n in positions.values()} == {1}
    assert sum(1 for metric, _ in positions if metric == "train/loss") == STEPS


def _ledger_of(name: str, seed: int, **kwargs) -> tuple[Ledger, str]:
    from scalelab.orchestrator.plan.expand import expand
    from scalelab.orchestrator.plan.spec import parse_spec

    spec, source = parse_spec(sweep_yaml(name, seeds=1, first_seed=seed))
    trials = expand(spec, source)
    ledger = Ledger(spec.name, **kwargs)
    ledger.sync(spec, trials)
    return ledger, trials[0].trial_id


def test_a_trial_claim_is_let_go_or_lapses_after_a_lease_on_another_host(work_home, sweep_name):
    """The claim on a trial, across sweeps: held while its driver lives, let go when its trial
    ends there, and lapsed once its driver on another host has not beaten for a lease (on the
    reader's own clock: a lease of 1.5 s here)."""
    import json

    ghost_id = "another-host:1:aaaaaa"
    ghost, tid = _ledger_of(f"{sweep_name}-a", 8520, driver_id=ghost_id)
    beat = {"t": time.time(), "host": "another-host", "pid": 1}
    ghost.client.set_tag(ghost.parent_id, "scalelab.driver." + ghost_id.replace(":", "_"),
                         json.dumps(beat))  # fmt: skip
    reader, same = _ledger_of(f"{sweep_name}-b", 8520, lease_s=1.5)
    reader.heartbeat()
    assert same == tid
    assert ghost.claim_trials([tid]) == {tid: None}
    assert reader.claim_trials([tid]) == {tid: f"{sweep_name}-a"}  # not watched for a lease
    time.sleep(1.6)  # a lease without a beat
    assert reader.claim_trials([tid]) == {tid: None}  # lapsed: epoch 1 is the reader's
    assert ghost.claim_trials([tid]) == {tid: f"{sweep_name}-b"}  # its own host lives
    reader.release_trial(tid)
    assert ghost.claim_trials([tid]) == {tid: None}  # let go: claimed at once
