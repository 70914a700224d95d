"""A trial cancelled before its spool reached MLflow stays cancelled: a spool sent later
(`scalelab results sync`) brings its points, never a status. Before, the spool's first
write (RUNNING) opened the KILLED run again and `scalelab status` showed a trial running
with no driver."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from faults.mlflow_kit import env, mlflow_points, scalelab, sweep_yaml

from scalelab.jobs.tracking.outbox import Outbox
from scalelab.orchestrator.ledger import Ledger
from scalelab.orchestrator.plan.expand import expand
from scalelab.orchestrator.plan.spec import parse_spec


@pytest.mark.slow
def test_a_cancelled_trial_stays_killed_when_its_spool_is_sent_later(tmp_path, empty_store):
    """Its job trains with MLflow out of its reach (everything waits in the spool) and is
    killed mid-training with its sender (SIGKILL, as a forced cancel ends a Ray task);
    `scalelab cancel` marks the run KILLED; `scalelab results sync` sends the spool."""
    home = tmp_path / "home"
    home.mkdir()
    text = sweep_yaml("cancelled-spool", seeds=1, steps=400)
    spec, source = parse_spec(text)
    (trial,) = expand(spec, source)
    ledger = Ledger(spec.name, tracking_uri=empty_store(home / "mlflow.db"))
    run_id = ledger.sync(spec, [trial])[trial.trial_id].run_id
    (tmp_path / "job.json").write_text(trial.job.model_dump_json())
    job = subprocess.Popen(
        [sys.executable, "-m", "scalelab.jobs.training.train", str(tmp_path / "job.json"), run_id],
        env=env(home, "http://127.0.0.1:9"), start_new_session=True,  # its sender too
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    outbox = Outbox(home / "trials" / trial.trial_id, run_id)
    try:
        deadline = time.time() + 120
        while sum(i["kind"] == "metric" for i in outbox.items()) < 10:
            assert job.poll() is None and time.time() < deadline, "no points spooled"
            time.sleep(0.1)
    finally:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()
    assert mlflow_points(ledger.uri, run_id) == {}  # MLflow saw nothing

    cancelled = scalelab("cancel", spec.name, home=home)
    assert cancelled.returncode == 0, cancelled.stderr[-3000:]
    info = ledger.client.get_run(run_id).info
    assert info.status == "KILLED"

    synced = scalelab("results", "sync", spec.name, home=home)
    assert synced.returncode == 0, synced.stderr[-3000:]

    assert outbox.pending() == 0
    spooled: dict[str, list] = {}
    for item in outbox.items():
        if item["kind"] == "metric":
            spooled.setdefault(item["key"], []).append((item["step"], item["value"]))
    assert mlflow_points(ledger.uri, run_id) == {k: sorted(v) for k, v in spooled.items()}
    after = ledger.client.get_run(run_id).info
    assert (after.status, after.end_time) == ("KILLED", info.end_time)
    shown = scalelab("status", spec.name, "--json", home=home)
    assert shown.returncode == 0, shown.stderr[-3000:]
    assert [t["status"] for t in json.loads(shown.stdout)["trials"]] == ["KILLED"]
