"""One real trial (jobs.training.train.run, DeepSpeed on CPU) driven by the scheduler into its run."""

from __future__ import annotations

import pytest

from scalelab.orchestrator.ledger import Ledger
from scalelab.orchestrator.plan.expand import expand
from scalelab.orchestrator.plan.spec import parse_spec
from scalelab.orchestrator.scheduler import run_sweep


@pytest.mark.slow
def test_real_training_job_logs_into_the_scheduled_run(ray_session, work_home, sweep_name):
    spec, source = parse_spec(f"""
name: {sweep_name}
base:
  model: {{size: nano, vocab_size: 256, block_size: 64}}
  data: {{source: "builtin:pydoc", tokenizer: byte, seq_len: 64}}
  train: {{tokens: 4096, global_batch_tokens: 512}}
  seed: 21  # its own trial: other tests' sweeps of seed 0 run test jobs, never a trained trial
backend: {{concurrency: 1, cpus_per_trial: 1}}
""")
    trials = expand(spec, source)
    out = run_sweep(spec, trials, Ledger(spec.name))  # default job: jobs.training.train:run
    assert out.finished == [trials[0].trial_id], out
    ledger = Ledger(spec.name)
    rec = ledger.records()[trials[0].trial_id]
    run = ledger.client.get_run(rec.run_id)
    assert run.info.status == "FINISHED"
    assert "val/loss" in run.data.metrics  # the job logged into the run the ledger created
    assert len(ledger.records()) == 1


@pytest.mark.slow
@pytest.mark.distributed
def test_a_trial_with_two_ranks_trains_in_its_task(ray_session, work_home, sweep_name):
    spec, source = parse_spec(f"""
name: {sweep_name}
base:
  model: {{size: nano, vocab_size: 256, block_size: 64}}
  data: {{source: "builtin:pydoc", tokenizer: byte, seq_len: 64}}
  train: {{tokens: 4096, global_batch_tokens: 512}}
  deepspeed: {{zero_stage: 2}}
  seed: 20  # its own trial: another test's 1-rank checkpoint of seed 0 must not be resumed
backend: {{concurrency: 1, cpus_per_trial: 2, ranks_per_trial: 2, max_retries: 0}}
""")
    (trial,) = expand(spec, source)
    out = run_sweep(spec, [trial], Ledger(spec.name))
    assert out.finished == [trial.trial_id], out
    ledger = Ledger(spec.name)
    run = ledger.client.get_run(ledger.records()[trial.trial_id].run_id)
    assert run.info.status == "FINISHED"
    assert run.data.tags["scalelab.world_size"] == "2"  # two DeepSpeed ranks, one trial
    assert "val/loss" in run.data.metrics
