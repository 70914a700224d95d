"""Small job functions with the jobs.training.train.run signature, for scheduler tests.

Each records its calls as files under $SCALELAB_HOME/calls/<run_id>/ so a test can
count how often a trial's run really ran (across processes and drivers; trial ids repeat
across tests' sweeps, run ids do not).
"""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path

from scalelab.contract.workdir import scalelab_home
from scalelab.jobs.config import JobConfig


def _calls(run_id: str | None) -> Path:
    d = scalelab_home() / "calls" / str(run_id)
    d.mkdir(parents=True, exist_ok=True)
    return d


def _record(job: JobConfig, run_id: str | None, what: str = "call") -> int:
    d = _calls(run_id)
    (d / f"{what}-{time.time_ns()}-{uuid.uuid4().hex[:6]}").write_text(f"{os.getpid()} {run_id}")
    return len(list(d.glob(f"{what}-*")))


def noop(job: JobConfig, run_id: str | None = None) -> dict:
    return {"status": "FINISHED"}


def worker_environment() -> dict:
    """What a Ray worker of the embedded cluster was started with (not a job body)."""
    import ray

    names = ("OMP_NUM_THREADS", "SCALELAB_MECHANISMS", "PYTHONPATH")
    env = {name: os.environ.get(name) for name in names}
    return env | {"runtime_env": dict(ray.get_runtime_context().runtime_env)}


def count(job: JobConfig, run_id: str | None = None) -> dict:
    _record(job, run_id)
    return {"status": "FINISHED"}


SLEEP_FILE = "test_sleep_s"  # under $SCALELAB_HOME; written by the `trial_sleep` fixture


def sleep_seconds() -> float:
    """How long `sleepy` sleeps: the work dir's SLEEP_FILE, else SCALELAB_TEST_SLEEP, else 2.

    The file comes first because an in-process test's environment never reaches the Ray
    workers of a session's shared Ray: they keep the environment Ray started with."""
    knob = scalelab_home() / SLEEP_FILE
    if knob.exists():
        return float(knob.read_text())
    return float(os.environ.get("SCALELAB_TEST_SLEEP", "2"))


def sleepy(job: JobConfig, run_id: str | None = None) -> dict:
    """Runs `sleep_seconds()`, then finishes."""
    _record(job, run_id, "start")
    time.sleep(sleep_seconds())
    _record(job, run_id)
    return {"status": "FINISHED"}


def flaky(job: JobConfig, run_id: str | None = None) -> dict:
    """Raises on the first two calls of a trial with seed 1; others finish."""
    n = _record(job, run_id)
    if job.seed == 1 and n <= 2:
        raise RuntimeError(f"flaky failure number {n}")
    return {"status": "FINISHED"}


def always_fails(job: JobConfig, run_id: str | None = None) -> dict:
    _record(job, run_id)
    raise ValueError("this job always fails")


def preempted_once(job: JobConfig, run_id: str | None = None) -> dict:
    n = _record(job, run_id)
    return {"status": "PREEMPTED" if n == 1 else "FINISHED", "reason": "test preemption"}


def talkative(job: JobConfig, run_id: str | None = None) -> dict:
    """Prints to stdout, to stderr and from a child process, and its Triton cache folder; the
    trial with seed 1 then raises (its traceback is what `status` and the log must show)."""
    import os
    import subprocess
    import sys

    _record(job, run_id)
    print(f"stdout of seed {job.seed}", flush=True)
    print(f"TRITON_CACHE_DIR={os.environ.get('TRITON_CACHE_DIR')}", flush=True)
    print(f"stderr of seed {job.seed}", file=sys.stderr, flush=True)
    subprocess.run(["echo", f"child process of seed {job.seed}"], check=True)
    if job.seed == 1:
        raise RuntimeError("talkative trial fails at the end of a long explanation " + "x" * 80)
    return {"status": "FINISHED"}


def diverges(job: JobConfig, run_id: str | None = None) -> dict:
    """The trial with seed 1 ends as jobs.training.train.run ends a diverged trial (its TrainResult's
    status, reason and flag); the others finish."""
    _record(job, run_id)
    if job.seed == 1:
        return {"status": "FAILED", "reason": "diverged: loss nan at step 3", "diverged": True}
    return {"status": "FINISHED"}


def curve(job: JobConfig, run_id: str | None = None) -> dict:
    """Writes down how many finished trials the parent run's live loss-vs-FLOPs figure shows
    now (`figure-<n>`; `figure-none` without one), then logs a val/loss curve against GFLOPs
    (steps 1, 2, 4) and finishes."""
    import tempfile

    from mlflow import MlflowClient
    from mlflow.entities import Metric as MlflowMetric
    from PIL import Image

    from scalelab.analysis.live_figure import FINISHED_KEY, FOLDER, NAME
    from scalelab.contract.runs import Metric
    from scalelab.contract.workdir import tracking_uri

    client = MlflowClient(tracking_uri())
    parent = client.get_run(run_id).data.tags["mlflow.parentRunId"]
    shown = "none"
    if f"{FOLDER}/{NAME}" in {a.path for a in client.list_artifacts(parent, FOLDER)}:
        with tempfile.TemporaryDirectory() as tmp:
            png = client.download_artifacts(parent, f"{FOLDER}/{NAME}", tmp)
            shown = Image.open(png).text[FINISHED_KEY]
    _record(job, run_id, f"figure-{shown}")
    now = int(time.time() * 1000)
    points = [MlflowMetric(Metric.VAL_LOSS_AT_GFLOP, 5.0 / s, now, s) for s in (1, 2, 4)]
    client.log_batch(run_id, metrics=points)
    return {"status": "FINISHED"}


def refuses(job: JobConfig, run_id: str | None = None) -> dict:
    """Refused by its node, as the training job refuses one without the GPUs it was asked."""
    from scalelab.contract.outcome import EnvironmentRefused

    _record(job, run_id)
    raise EnvironmentRefused(f"no GPU for seed {job.seed}")


def rank_one_refuses(job: JobConfig, run_id: str | None = None) -> dict:
    """Task 1 of a SLURM job refuses its node at once, as the training job's device check
    does; task 0 stands for a rank waiting at the rendezvous for the others (it would wait
    out deepspeed.dist_timeout_minutes)."""
    from scalelab.contract.outcome import EnvironmentRefused

    if os.environ.get("SLURM_PROCID") == "1":
        raise EnvironmentRefused(f"task 1 found no GPU for seed {job.seed}")
    time.sleep(300)
    return {"status": "FINISHED"}


def trunk_or_branch(job: JobConfig, run_id: str | None = None) -> dict:
    """A wsd trunk writes its branches' seeds as the training job does (a complete
    checkpoint folder in each branch's ckpt/, jobs/training/branch_seed.py) after a moment;
    a branch records whether its seed was there when it started (`seeded-*` / `unseeded-*`)."""
    from scalelab.contract.workdir import trial_dir

    _record(job, run_id)
    if job.train.branch_seeds:
        time.sleep(0.5)
        for b in job.train.branch_seeds:
            tag = trial_dir(b.trial_id) / "ckpt" / f"step{b.step:08d}"
            tag.mkdir(parents=True, exist_ok=True)
            (tag / "COMPLETE").write_text("{}")
    elif job.train.schedule == "wsd":
        seeded = any((trial_dir(job.trial_id) / "ckpt").glob("step*/COMPLETE"))
        _record(job, run_id, "seeded" if seeded else "unseeded")
    return {"status": "FINISHED"}


def stepping_wsd(job: JobConfig, run_id: str | None = None) -> dict:
    """Trains a wsd trial as steps of `sleep_seconds()` / 10, resumable as the training job
    is: its newest `ckpt/step<k>/COMPLETE` (one per step) is where it starts; a trunk seeds
    each branch at its step as jobs/training/branch_seed.py does (a branch holding a
    checkpoint is not touched). Each step trained leaves `trained/<k>` in the trial folder,
    and `twice-<k>` under calls/ when step k's checkpoint was complete already: trained again
    past its checkpoint. (A step trained but not yet checkpointed when its worker was
    killed is trained again by the resume, as the training job does: that is no repeat.)"""
    from scalelab.contract.workdir import trial_dir
    from scalelab.jobs.token_budget import total_steps

    _record(job, run_id)
    here = trial_dir(job.trial_id)
    markers = sorted((here / "ckpt").glob("step*/COMPLETE"))
    done = [int(p.parent.name[4:]) for p in markers]
    carried = markers[-1].read_text() if markers else "{}"  # its loop state goes on
    if job.train.schedule == "wsd" and not job.train.branch_seeds:
        _record(job, run_id, "seeded" if done else "unseeded")
    (here / "trained").mkdir(parents=True, exist_ok=True)
    seeds = {s.step: s.trial_id for s in job.train.branch_seeds}
    for step in range(done[-1] if done else 0, total_steps(job)):
        time.sleep(sleep_seconds() / 10)
        tag = f"step{step + 1:08d}"
        if (here / "ckpt" / tag / "COMPLETE").exists():
            _record(job, run_id, f"twice-{step + 1}")
        (here / "trained" / str(step + 1)).touch()
        (here / "ckpt" / tag).mkdir(parents=True, exist_ok=True)
        (here / "ckpt" / tag / "COMPLETE").write_text(carried)
        branch = trial_dir(seeds.get(step + 1, "none")) / "ckpt"
        if step + 1 in seeds and not any(branch.glob("step*/COMPLETE")):
            (branch / tag).mkdir(parents=True, exist_ok=True)
            seeded = {"trial_id": job.trial_id, "step": step + 1}
            (branch / tag / "COMPLETE").write_text(json.dumps({"state": {"branched_from": seeded}}))
    return {"status": "FINISHED"}


STEP_PAUSE_FILE = "test_step_pause_s"  # under $SCALELAB_HOME: `training_on_node` pauses


def training_on_node(job: JobConfig, run_id: str | None = None) -> dict:
    """The training job, recording where each attempt runs and what it starts from: a
    `node-<ray node id>-from-<newest complete checkpoint step>` file under calls/. The work
    dir's STEP_PAUSE_FILE, when there, paces every step (seconds, at its learning rate's
    look-up: not science, the losses stay those of the plain job), so a test can act
    between two checkpoints."""
    import ray

    from scalelab.contract.workdir import trial_dir
    from scalelab.jobs.training import train

    node = ray.get_runtime_context().get_node_id()
    steps = [
        int(p.parent.name[4:]) for p in (trial_dir(job.trial_id) / "ckpt").glob("step*/COMPLETE")
    ]
    _record(job, run_id, f"node-{node}-from-{max(steps, default=0)}")
    knob = scalelab_home() / STEP_PAUSE_FILE
    pause = float(knob.read_text()) if knob.exists() else 0.0
    lr_at = train.lr_at

    def paced(*args, **kwargs):
        time.sleep(pause)
        return lr_at(*args, **kwargs)

    train.lr_at = paced  # this worker runs nothing else of the test's (one trial per node)
    try:
        return train.run(job, run_id)
    finally:
        train.lr_at = lr_at


HOLD_FILE = "test_hold"  # under $SCALELAB_HOME: `held_training` waits while it exists


def held_training(job: JobConfig, run_id: str | None = None) -> dict:
    """The training job, recorded (`train-*` under calls/), that waits before its third step
    while the work dir's HOLD_FILE exists (120 s at most), so a test can act while it trains
    with two steps already in its curves.jsonl (the wait is at the learning rate's look-up:
    the losses stay those of the plain job)."""
    from scalelab.jobs.training import train

    _record(job, run_id, "train")
    knob = scalelab_home() / HOLD_FILE
    lr_at = train.lr_at

    def held(step: int, *args, **kwargs):
        deadline = time.monotonic() + 120
        while step >= 2 and knob.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        return lr_at(step, *args, **kwargs)

    train.lr_at = held
    try:
        return train.run(job, run_id)
    finally:
        train.lr_at = lr_at


def status_at_start(job: JobConfig, run_id: str | None = None) -> dict:
    """Records the status MLflow shows for its run as it starts (`status-<STATUS>`), then
    finishes."""
    from mlflow import MlflowClient

    from scalelab.contract.workdir import tracking_uri

    _record(job, run_id, f"status-{MlflowClient(tracking_uri()).get_run(run_id).info.status}")
    return {"status": "FINISHED"}


# lr_bowl: a val loss that is a known law in compute times a bowl in log-rate around
# LR_OPTIMUM, for the tuning stage's tests (orchestrator/plan/tuning.py)
LR_OPTIMUM = 2e-3
LR_SHIFT = {"hadamard": 4.0}  # the variant's effective rate is 4x its lr: optimum at 5e-4
BOWL = 0.05  # relative loss per (ln rate)^2 off the optimum


def lr_bowl(job: JobConfig, run_id: str | None = None) -> dict:
    """Writes the trial's result.json as a finished training does, with final_val_loss =
    50 * C^-0.1 * (1 + BOWL * ln(lr * shift / LR_OPTIMUM)^2) (C its training FLOPs; shift:
    LR_SHIFT of its variant, else 1), plus a per-seed wobble of 0.1%."""
    import math

    from scalelab.contract.workdir import RESULT_FILE, trial_dir
    from scalelab.models.flops import count_params, train_flops_per_token

    _record(job, run_id)
    flops = job.train.tokens * train_flops_per_token(job.model, job.data.seq_len)
    off = math.log(job.train.lr * LR_SHIFT.get(job.model.variant, 1.0) / LR_OPTIMUM)
    loss = 50 * flops**-0.1 * (1 + BOWL * off**2) * (1 + 0.001 * math.sin(7 * job.seed + 1))
    result = {"status": "FINISHED", "final_val_loss": loss, "best_val_loss": loss,
              "flops": flops, "tokens": job.train.tokens, "n_params": count_params(job.model),
              "run_id": run_id}  # fmt: skip
    path = trial_dir(job.trial_id) / RESULT_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result))
    return result


def slow_lr_bowl(job: JobConfig, run_id: str | None = None) -> dict:
    """`lr_bowl` after a sleep of `sleep_seconds()`."""
    time.sleep(sleep_seconds())
    return lr_bowl(job, run_id)
