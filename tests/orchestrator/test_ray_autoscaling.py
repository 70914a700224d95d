"""Backend `ray` on a cluster that scales with the sweep and loses a node under a trial, as
a cloud's does: Ray's fake multi-node autoscaler (tests/orchestrator/fake_cloud.py), one
cluster for the module. Its head offers no trial resources; its worker nodes offer
`fake_gpu`, which the trials ask for (`backend.resources_per_trial`) where a real cluster's
would offer GPUs, so they train on CPU. A real `scalelab submit` drives each sweep.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from fake_cloud import HEAD_NODE_ID, FakeCloud
from jobs_for_tests import STEP_PAUSE_FILE

pytestmark = pytest.mark.slow  # a cluster, nodes that come and go, two trainings: ~60 s

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
IDLE_TIMEOUT_S = 3.0
WORKER = {"resources": {"CPU": 1, "fake_gpu": 1, "object_store_memory": 100 * 2**20}}
BACKEND = (
    "{{kind: ray, address: '{address}', allow_file_tracking: true, concurrency: 1, "
    "cpus_per_trial: 1, resources_per_trial: {{fake_gpu: 1}}, max_retries: 0}}"
)


@pytest.fixture(scope="module")
def cloud(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("fake-cloud")
    cluster = FakeCloud(root, {"gpu_worker": {**WORKER, "max_workers": 2}}, IDLE_TIMEOUT_S)
    try:
        yield cluster.start()
    finally:
        cluster.stop()


@dataclass
class Sweep:
    home: Path
    trial_id: str
    run_id: str
    tags: dict[str, str]
    status: str

    def attempts(self) -> list[tuple[str, int]]:
        """(node id, newest checkpoint step it started from) of each attempt, in order."""
        found = sorted((self.home / "calls" / self.run_id).glob("node-*"),
                       key=lambda p: int(p.name.split("-")[4]))  # fmt: skip
        return [(p.name.split("-")[1], int(p.name.split("-")[3])) for p in found]

    def losses(self) -> list[tuple[int, float]]:
        rows = (self.home / "trials" / self.trial_id / "curves.jsonl").read_text().splitlines()
        points = [json.loads(row) for row in rows]
        return [(p["step"], p["value"]) for p in points if p["metric"] == "train/loss"]


def _submit(cloud: FakeCloud, home: Path) -> subprocess.Popen:
    sweep = home / "sweep.yaml"
    home.mkdir(parents=True, exist_ok=True)
    sweep.write_text(f"""
name: {home.name}
base:
  model: {{size: nano, vocab_size: 256, block_size: 64}}
  data: {{source: "builtin:pydoc", tokenizer: byte, seq_len: 64}}
  train: {{tokens: 4096, global_batch_tokens: 512, log_interval: 1, checkpoint_interval: 2,
          eval_interval: 1000}}
backend: {BACKEND.format(address=cloud.address)}
""")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "MLFLOW_"))}
    env |= cloud.env() | {
        "SCALELAB_HOME": str(home),
        "SCALELAB_DATA": str(cloud.root / "data"),  # both sweeps' trials read one copy
        "PYTHONPATH": os.pathsep.join([str(REPO), str(HERE)]),
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    cmd = [sys.executable, "-m", "scalelab.cli.main", "submit", str(sweep),
           "--job", "jobs_for_tests:training_on_node", "--no-summary"]  # fmt: skip
    log = open(home / "driver.log", "w")  # noqa: SIM115 (the driver's, closed with it)
    return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=home)


def _ended(driver: subprocess.Popen, home: Path, timeout_s: float = 180) -> Sweep:
    try:
        driver.wait(timeout=timeout_s)
    finally:
        if driver.poll() is None:
            driver.kill()
    log = (home / "driver.log").read_text()
    assert driver.returncode == 0, log[-3000:]
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{home / 'mlflow.db'}")
    (experiment,) = [e for e in client.search_experiments() if e.name == home.name]
    runs = client.search_runs([experiment.experiment_id], "tags.`scalelab.role` = 'trial'")
    (run,) = runs
    tags = run.data.tags
    return Sweep(home, tags["scalelab.trial_id"], run.info.run_id, tags, run.info.status)


@pytest.fixture(scope="module")
def uninterrupted(cloud: FakeCloud, tmp_path_factory: pytest.TempPathFactory):
    """One trial submitted to the cluster with no worker node: (the sweep, the workers seen
    before it, while it ran)."""
    home = tmp_path_factory.mktemp("uninterrupted")
    before = cloud.workers()
    driver = _submit(cloud, home)
    seen: set[str] = set()
    deadline = time.monotonic() + 180
    while driver.poll() is None and time.monotonic() < deadline:
        seen |= cloud.workers()
        time.sleep(0.3)
    return _ended(driver, home), before, seen


def test_a_sweep_scales_the_cluster_up_from_no_workers_and_back_down(cloud, uninterrupted):
    sweep, before, seen = uninterrupted
    assert before == set()  # no worker when the sweep came
    assert sweep.status == "FINISHED"
    ((node, start),) = sweep.attempts()
    assert node != HEAD_NODE_ID and node in seen  # on a worker the autoscaler added for it
    assert start == 0 and len(sweep.losses()) == 8
    # the trials' files went where the driver said, not where the nodes were started
    assert not (cloud.root / "scalelab-runs").exists()
    cloud.wait_for_workers(0, timeout_s=IDLE_TIMEOUT_S + 30)  # idle: given back


def test_a_trial_whose_node_is_reclaimed_resumes_on_another_node(cloud, uninterrupted, tmp_path):
    """A spot reclaim: the node running the trial is killed after a checkpoint. The trial
    is placed again, resumes from that checkpoint on a new node under the same run, with
    the uninterrupted trial's losses; the driver counts a preemption, not a failure
    (max_retries 0: a failure would end it)."""
    reference, _, _ = uninterrupted
    home = tmp_path / "reclaimed"
    home.mkdir()
    (home / STEP_PAUSE_FILE).write_text("0.5")  # room to act between checkpoints
    driver = _submit(cloud, home)
    ckpt = home / "trials" / reference.trial_id / "ckpt"
    deadline = time.monotonic() + 120
    while not list(ckpt.glob("step*/COMPLETE")):
        assert driver.poll() is None and time.monotonic() < deadline, "no checkpoint came"
        time.sleep(0.1)
    (attempt,) = list((home / "calls").glob("*/node-*"))
    node = attempt.name.split("-")[1]
    cloud.reclaim(node)
    newest = max(int(p.parent.name[4:]) for p in ckpt.glob("step*/COMPLETE"))
    sweep = _ended(driver, home)

    assert sweep.status == "FINISHED" and sweep.trial_id == reference.trial_id
    (first, _), (second, start) = sweep.attempts()  # the run id they were given: one run
    assert first == node and second not in (node, HEAD_NODE_ID)
    assert 0 < start == newest < 8  # from the last checkpoint, not from step 0
    assert sweep.tags["scalelab.attempts"] == "1" and "scalelab.preempted" in sweep.tags
    assert "scalelab.error" not in sweep.tags
    assert sweep.losses() == reference.losses()
