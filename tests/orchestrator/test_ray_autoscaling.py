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

pytestmark = pytest.mark.slow  # a cluster, nodes that come and go, three attempts: 75-100 s

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
    cluster = FakeCloud(root, {"gpu_worker": {**WORKER, "max_workers": 3}}, IDLE_TIMEOUT_S)
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
    exit_code: int | None  # the driver's
    log: str  # the end of the driver's output

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
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{home / 'mlflow.db'}")
    (experiment,) = [e for e in client.search_experiments() if e.name == home.name]
    runs = client.search_runs([experiment.experiment_id], "tags.`scalelab.role` = 'trial'")
    (run,) = runs
    tags = run.data.tags
    log = (home / "driver.log").read_text()[-3000:]
    return Sweep(home, tags["scalelab.trial_id"], run.info.run_id, tags, run.info.status,
                 driver.returncode, log)  # fmt: skip


@dataclass
class Seen:
    """Both sweeps, submitted at once to the cluster with no worker node, and what the
    test saw of the cluster: its workers before, while they ran, and the node reclaimed
    under the second sweep's trial after its first checkpoint (`complete_before`: the last
    checkpoint complete when the reclaim was asked for; `newest`: the last one complete
    just after: a loaded machine's node takes a moment to go, and a checkpoint can complete
    in it)."""

    uninterrupted: Sweep
    reclaimed: Sweep
    before: set[str]
    seen: set[str]
    reclaimed_node: str
    newest: int
    complete_before: int = 0


@pytest.fixture(scope="module")
def sweeps(cloud: FakeCloud, tmp_path_factory: pytest.TempPathFactory) -> Seen:
    before = cloud.workers()
    straight, reclaimed = tmp_path_factory.mktemp("straight"), tmp_path_factory.mktemp("reclaim")
    (reclaimed / STEP_PAUSE_FILE).write_text("0.5")  # room to act between checkpoints
    drivers = [_submit(cloud, straight), _submit(cloud, reclaimed)]
    seen: set[str] = set()
    node, newest, complete_before = "", 0, 0
    deadline = time.monotonic() + 240
    while any(d.poll() is None for d in drivers) and time.monotonic() < deadline:
        seen |= cloud.workers()
        done = list(reclaimed.glob("trials/*/ckpt/step*/COMPLETE"))
        if done and not node:
            (attempt,) = reclaimed.glob("calls/*/node-*")
            node = attempt.name.split("-")[1]
            complete_before = max(int(p.parent.name[4:]) for p in done)
            cloud.reclaim(node)  # a spot reclaim, after the trial's first checkpoint
            newest = max(int(p.parent.name[4:]) for p in reclaimed.glob("trials/*/ckpt/*/COMPLETE"))
        time.sleep(0.1)
    ended = [_ended(d, home) for d, home in zip(drivers, (straight, reclaimed), strict=True)]
    return Seen(*ended, before, seen, node, newest, complete_before)


def test_a_sweep_scales_the_cluster_up_from_no_workers_and_back_down(cloud, sweeps):
    assert sweeps.before == set()  # no worker when the sweeps came
    sweep = sweeps.uninterrupted
    assert sweep.exit_code == 0 and sweep.status == "FINISHED", sweep.log
    ((node, start),) = sweep.attempts()
    assert node != HEAD_NODE_ID and node in sweeps.seen  # a worker the autoscaler added
    assert start == 0 and len(sweep.losses()) == 8
    # the trials' files went where the driver said, not where the nodes were started
    assert not (cloud.root / "scalelab-runs").exists()
    cloud.wait_for_workers(0, timeout_s=IDLE_TIMEOUT_S + 30)  # idle: given back


def test_a_trial_whose_node_is_reclaimed_resumes_on_another_node(sweeps):
    """A spot reclaim: the node running the trial is killed after a checkpoint. The trial
    is placed again, resumes from its last checkpoint on a new node under the same run, with
    the uninterrupted trial's losses; the driver counts a preemption, not a failure
    (max_retries 0: a failure would end it)."""
    sweep, reference = sweeps.reclaimed, sweeps.uninterrupted
    assert sweeps.reclaimed_node, "the trial finished before a checkpoint was seen"
    assert sweep.exit_code == 0 and sweep.status == "FINISHED", sweep.log
    assert sweep.trial_id == reference.trial_id
    (first, _), (second, start) = sweep.attempts()  # the run id they were given: one run
    assert first == sweeps.reclaimed_node and second not in (first, HEAD_NODE_ID)
    # from the last checkpoint, not from step 0
    assert 0 < sweeps.complete_before <= start <= sweeps.newest < 8
    assert sweep.tags["scalelab.attempts"] == "1" and "scalelab.preempted" in sweep.tags
    assert "scalelab.error" not in sweep.tags
    assert sweep.losses() == reference.losses()
