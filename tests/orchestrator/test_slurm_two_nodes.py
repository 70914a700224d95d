"""A trial on 2 SLURM nodes: two slurmd on this host (tests/slurm_cluster.py's
two_node_cluster), one DeepSpeed rank per node, the rendezvous on the first node."""

from __future__ import annotations

import subprocess

import pytest
from mlflow import MlflowClient

from scalelab.contract import workdir
from scalelab.contract.runs import Tag
from scalelab.contract.workdir import tracking_uri
from scalelab.orchestrator.ledger import Ledger
from scalelab.orchestrator.plan.expand import expand
from scalelab.orchestrator.plan.spec import parse_spec
from scalelab.orchestrator.scheduler import run_sweep

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def test_a_trial_runs_one_rank_on_each_of_two_nodes(
    two_node_cluster, ray_session, work_home, sweep_name, tmp_path, monkeypatch
):
    monkeypatch.setenv("SLURM_CONF", str(two_node_cluster))  # sbatch, sacct, the job itself
    path = tmp_path / "sweep.yaml"
    path.write_text(f"""
name: {sweep_name}
base:
  model: {{size: nano, vocab_size: 256, block_size: 32}}
  data: {{source: "builtin:pydoc", seq_len: 32, val_tokens: 256}}
  train: {{tokens: 2048, global_batch_tokens: 256, lr: 3.0e-3, log_interval: 4,
           eval_interval: 1000, checkpoint_interval: 1000}}
backend: {{kind: slurm, concurrency: 1, max_retries: 0,
          slurm: {{partition: two, time_min: 10, poll_s: 1, nodes: 2, tasks_per_node: 1}}}}
""")
    spec, source = parse_spec(path.read_text(), path)
    (trial,) = expand(spec, source)
    out = run_sweep(spec, [trial], Ledger(spec.name))

    assert out.finished == [trial.trial_id], out
    rec = Ledger(sweep_name).records()[trial.trial_id]
    job_id = rec.tags[Tag.JOB_REF].removeprefix("slurm:")
    shown = subprocess.run(
        ["sacct", "-n", "-X", "-P", "-j", job_id, "--format=NNodes,NodeList,State"],
        capture_output=True, text=True, check=True,
    ).stdout.split("|")  # fmt: skip
    assert shown[0] == "2" and "," in shown[1], f"one job on two nodes: {shown}"
    run = MlflowClient(tracking_uri()).get_run(rec.run_id)
    assert run.data.tags[Tag.WORLD_SIZE] == "2"
    history = MlflowClient(tracking_uri()).get_metric_history(rec.run_id, "train/loss")
    assert sorted(m.step for m in history) == [4, 8]
    # each node's gloo (the preemption vote) on the interface that reaches the first node:
    # both "nodes" are names of 127.0.0.1 here (jobs/training/distributed.py, route_interface)
    for rank in (0, 1):  # each rank's own log (rank 0's is the trial's)
        log = workdir.trial_log(trial.trial_id, rank).read_text()
        assert f"rank {rank}: gloo on interface lo (routes to " in log, log
