"""A tuned sweep's driver killed with SIGKILL in the middle of its learning-rate search
(orchestrator/tuned_run.py), then resubmitted: the search resumes where it stopped, a
search point that had finished is not trained again, and the ladder then runs at each
variant's tuned rate (real Ray and MLflow; the trials are `jobs_for_tests.slow_lr_bowl`,
`lr_bowl` after a sleep of `sleep_seconds()`, so the search can be caught half done)."""

from __future__ import annotations

import os
import signal

import pytest
from conftest import calls
from jobs_for_tests import LR_OPTIMUM, LR_SHIFT
from test_trial_claims import _until, start_driver
from test_tuning_stage import BACKEND, RATES, tuned_yaml
from typer.testing import CliRunner

from scalelab.cli.main import app
from scalelab.contract.runs import Tag
from scalelab.orchestrator import door
from scalelab.orchestrator.ledger import Ledger
from scalelab.orchestrator.plan.tuning import BOTH, LADDER, TUNE

JOB = "jobs_for_tests:slow_lr_bowl"
SLOW_BACKEND = "{concurrency: 1, cpus_per_trial: 0.25, max_retries: 0, retry_backoff_s: 0.1}"


def _search_finished(name: str) -> dict[str, str]:
    """The search trials the ledger has as FINISHED: their run ids by trial id (none before
    the sweep's experiment is there)."""
    try:
        records = Ledger(name).records()
    except Exception:  # the sweep's experiment or parent run is not there yet
        return {}
    return {
        tid: rec.run_id
        for tid, rec in records.items()
        if rec.tags.get(Tag.STAGE) == TUNE and rec.status == "FINISHED"
    }


@pytest.mark.slow
def test_a_driver_killed_during_the_search_resumes_it_without_retraining(
    tmp_path, ray_session, work_home, sweep_name, trial_sleep
):
    text = tuned_yaml(sweep_name)
    assert "seed: 9400" in text and BACKEND in text
    path = tmp_path / "tuned.yaml"
    path.write_text(text.replace("seed: 9400", "seed: 9500").replace(BACKEND, SLOW_BACKEND))
    searched = [t for t in door.load(path).trials if t.stage == TUNE]
    assert len(searched) == 2 * len(RATES)

    trial_sleep(1.0)  # one search trial at a time, a second each
    driver, log = start_driver(path, tmp_path / "driver.log", JOB)
    try:
        _until(
            "two search trials finished",
            lambda: len(_search_finished(sweep_name)) >= 2,
            [(driver, log)],
            deadline_s=90,
        )
    finally:
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait()
    before = Ledger(sweep_name).records()
    finished = _search_finished(sweep_name)
    assert 2 <= len(finished) < len(searched)  # killed in the middle of the search
    assert not {r.tags.get(Tag.STAGE) for r in before.values()} & {LADDER, BOTH}

    status = CliRunner().invoke(app, ["status", sweep_name], env={"COLUMNS": "250"})
    assert f"stage 1 of 2: the lr search, {len(finished)}/{len(searched)} finished" in (
        status.stdout
    ), status.output

    trial_sleep(0.0)
    ran = door.run(door.load(path), job=JOB)
    assert ran.ok, ran.outcome
    records = Ledger(sweep_name).records()
    trials = ran.sweep.trials
    assert {records[t.trial_id].status for t in trials} == {"FINISHED"}
    assert {t.trial_id for t in searched} <= {t.trial_id for t in trials}
    for tid, run_id in finished.items():  # the same run, trained once across both drivers
        assert records[tid].run_id == run_id
        assert calls(work_home, run_id) == 1, tid
    assert set(finished) <= set(ran.outcome.skipped)

    ladder = [t for t in trials if t.stage in (LADDER, BOTH)]
    assert len(ladder) == 3 * 3  # three sizes: dense, hadamard at its own and at dense's rate
    for t in ladder:
        assert records[t.trial_id].tags[Tag.STAGE] == t.stage
    dense = {t.job.train.lr for t in ladder if t.variant == "dense"}
    (dense_rate,) = dense
    assert dense_rate == pytest.approx(LR_OPTIMUM, rel=0.02)  # the bowl's vertex
    (own,) = {t.job.train.lr for t in ladder if t.variant == "hadamard"} - dense
    assert own == pytest.approx(LR_OPTIMUM / LR_SHIFT["hadamard"], rel=0.02)
