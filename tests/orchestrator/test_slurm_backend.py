"""The slurm backend on a real single-node SLURM (tests/slurm_cluster.py starts it)."""

from __future__ import annotations

import pytest
from conftest import calls, sweep_yaml

from orchestrator.expand import expand
from orchestrator.ledger import Ledger
from orchestrator.scheduler import run_sweep
from orchestrator.spec import parse_spec

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def test_array_of_trials_runs_and_records_job_ids(
    slurm_cluster, ray_session, work_home, sweep_name
):
    backend = (
        "{kind: slurm, concurrency: 4, max_retries: 2, retry_backoff_s: 0.1, "
        f"slurm: {{partition: {slurm_cluster.partition}, time_min: 5, poll_s: 1}}}}"
    )
    spec, source = parse_spec(sweep_yaml(sweep_name, seeds=3, backend=backend))
    trials = expand(spec, source)
    out = run_sweep(spec, trials, Ledger(spec.name), job="jobs_for_tests:flaky")
    assert sorted(out.finished) == sorted(t.trial_id for t in trials)
    recs = Ledger(spec.name).records()
    refs = [r.tags["scalelab.job_ref"] for r in recs.values()]
    assert all(ref.startswith("slurm:") for ref in refs)
    first = [ref for ref, r in zip(refs, recs.values(), strict=True) if r.attempts == 1]
    assert any("_" in ref for ref in first)  # the first round went out as one job array
    flaky = next(t.trial_id for t in trials if t.job.seed == 1)
    assert recs[flaky].attempts == 3 and calls(work_home, recs[flaky].run_id) == 3
    assert "flaky failure number 2" in recs[flaky].tags["scalelab.error"]  # from the job's log
