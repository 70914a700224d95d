"""A cancelled trial submitted again runs again as an open run: its driver sets the KILLED
run SCHEDULED before the launch (a job's spool never opens a run its driver ended:
jobs/tracking/outbox.py), so `status` shows it live while it runs, then FINISHED."""

from __future__ import annotations

import threading
import time

from conftest import calls, sweep_yaml

from scalelab.orchestrator.ledger import Ledger
from scalelab.orchestrator.plan.expand import expand
from scalelab.orchestrator.plan.spec import parse_spec
from scalelab.orchestrator.scheduler import run_sweep


def test_a_cancelled_trial_submitted_again_is_open_while_it_runs(
    ray_session, work_home, sweep_name, trial_sleep
):
    trial_sleep(60)
    spec, source = parse_spec(sweep_yaml(sweep_name, seeds=1, first_seed=7100))
    trials = expand(spec, source)
    out = {}
    driver = threading.Thread(
        target=lambda: out.update(
            first=run_sweep(
                spec, trials, Ledger(spec.name), job="jobs_for_tests:sleepy", cancel_poll_s=0.2
            )  # fmt: skip
        )
    )
    driver.start()
    ledger = Ledger(spec.name)
    t0 = time.monotonic()
    while (
        not (runs := [rec.run_id for rec in ledger.records().values()])
        or calls(work_home, runs[0], "start") < 1
    ):
        assert time.monotonic() - t0 < 60, "the trial did not start"
        time.sleep(0.2)
    (run_id,) = runs
    ledger.request_cancel()
    driver.join(timeout=30)
    assert not driver.is_alive() and out["first"].killed
    assert ledger.record(run_id).status == "KILLED"

    again = run_sweep(spec, trials, Ledger(spec.name), job="jobs_for_tests:status_at_start")

    assert again.finished == [trials[0].trial_id]
    assert calls(work_home, run_id, "status-SCHEDULED") == 1  # not KILLED while it ran
    assert ledger.record(run_id).status == "FINISHED"
