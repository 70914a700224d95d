"""Kill -9 of a driver while a wsd trunk trains, then a resubmit: the trunk resumes from
its checkpoint, each cooldown branch runs once from its seed, no step is trained twice
(real Ray and MLflow; the job function trains resumable steps: jobs_for_tests.stepping_wsd)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import HERE, calls, wsd_sweep_yaml
from typer.testing import CliRunner

from scalelab.cli.main import app
from scalelab.contract.workdir import trial_dir
from scalelab.orchestrator.ledger import Ledger
from scalelab.orchestrator.plan.expand import expand
from scalelab.orchestrator.plan.spec import parse_spec

JOB = "jobs_for_tests:stepping_wsd"


@pytest.mark.slow
def test_kill_9_while_the_trunk_trains_then_resubmit(
    tmp_path, ray_session, work_home, sweep_name, trial_sleep
):
    backend = "{concurrency: 2, cpus_per_trial: 0.5, retry_backoff_s: 0.1}"
    text = wsd_sweep_yaml(sweep_name, seed=23, backend=backend)
    path = tmp_path / "sweep.yaml"
    path.write_text(text)
    short, middle, trunk = expand(*parse_spec(text))  # 4, 8, 16 steps; seeds at 3 and 6
    trial_sleep(2.0)  # 0.2 s a step
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
    }
    log = tmp_path / "driver.log"
    with log.open("wb") as out:
        driver = subprocess.Popen(
            [sys.executable, "-m", "scalelab.cli.main", "submit", str(path), "--job", JOB],
            env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    deadline = time.monotonic() + 120
    trained = trial_dir(trunk.trial_id) / "trained"
    while not (trained / "7").exists():  # past both seeds, before its cooldown
        assert driver.poll() is None, log.read_text(errors="replace")[-3000:]
        assert time.monotonic() < deadline, "the trunk did not get to step 7"
        time.sleep(0.1)
    os.killpg(driver.pid, signal.SIGKILL)
    driver.wait()
    killed_at = len(list(trained.iterdir()))
    assert killed_at < 16
    # The kill can catch a branch mid-run: that one is started once more and goes on from
    # its own checkpoint; a branch the ledger had as finished is not started again.
    before = Ledger(sweep_name).records()
    started_before = {
        b.trial_id: calls(work_home, before[b.trial_id].run_id) if b.trial_id in before else 0
        for b in (short, middle)
    }
    finished_before = {t for t, r in before.items() if r.status == "FINISHED"}

    trial_sleep(0.2)
    result = CliRunner().invoke(app, ["submit", str(path), "--job", JOB])
    assert result.exit_code == 0, result.output
    assert (
        "cooldown branches: 2 trial(s) shared their steps before the cooldown with 1 longer one(s)"
        in result.output
    )
    records = Ledger(sweep_name).records()
    assert {r.status for r in records.values()} == {"FINISHED"}
    runs = {t.trial_id: records[t.trial_id].run_id for t in (short, middle, trunk)}
    for t in (short, middle, trunk):
        assert not [p for p in (work_home / "calls" / runs[t.trial_id]).glob("twice-*")]
    assert calls(work_home, runs[trunk.trial_id]) >= 2  # started again: resumed
    assert sorted(int(p.name) for p in trained.iterdir()) == list(range(1, 17))
    for branch, seed in ((short, 3), (middle, 6)):
        started = calls(work_home, runs[branch.trial_id])
        again = 0 if branch.trial_id in finished_before else 1
        assert started - started_before[branch.trial_id] <= again
        assert 1 <= started <= 2
        assert calls(work_home, runs[branch.trial_id], "unseeded") == 0
        assert calls(work_home, runs[branch.trial_id], "seeded") == started  # from its seed
        steps = sorted(int(p.name) for p in (trial_dir(branch.trial_id) / "trained").iterdir())
        assert steps[0] == seed + 1  # its cooldown only
