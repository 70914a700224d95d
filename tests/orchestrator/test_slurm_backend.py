"""The slurm backend on a real single-node SLURM (tests/slurm_cluster.py starts it)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import HERE, calls, sweep_yaml
from mlflow import MlflowClient
from typer.testing import CliRunner

from scalelab.cli.main import app
from scalelab.contract import workdir
from scalelab.contract.runs import Tag
from scalelab.contract.workdir import tracking_uri
from scalelab.orchestrator.ledger import Ledger
from scalelab.orchestrator.plan.expand import expand
from scalelab.orchestrator.plan.spec import parse_spec
from scalelab.orchestrator.scheduler import run_sweep

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
    assert "scalelab.error" not in recs[flaky].tags  # finished: no error left on its run
    log = (work_home / "trials" / flaky / "logs" / "trial.log").read_text()
    assert "flaky failure number 2" in log  # what its failed attempts raised, in its log


def test_a_slurm_trial_s_output_is_in_its_log_and_on_its_run(
    slurm_cluster, ray_session, work_home, sweep_name, monkeypatch
):
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)  # sbatch passes the driver's on
    backend = (
        "{kind: slurm, concurrency: 1, max_retries: 0, "
        f"slurm: {{partition: {slurm_cluster.partition}, time_min: 5, poll_s: 1}}}}"
    )
    spec, source = parse_spec(sweep_yaml(sweep_name, seeds=1, first_seed=7500, backend=backend))
    (trial,) = expand(spec, source)
    out = run_sweep(spec, [trial], Ledger(spec.name), job="jobs_for_tests:talkative")
    assert out.finished == [trial.trial_id]
    log = workdir.trial_log(trial.trial_id).read_text()
    for line in ("stdout of seed 7500", "stderr of seed 7500", "child process of seed 7500"):
        assert line in log  # what the job printed on the SLURM node, fds 1 and 2
    # Triton's kernel cache is node-local, not ~/.triton on a shared home
    assert f"TRITON_CACHE_DIR={os.environ.get('TMPDIR') or '/tmp'}/scalelab-triton-" in log
    run_id = Ledger(spec.name).records()[trial.trial_id].run_id
    client = MlflowClient(tracking_uri())
    assert "job.json" in {a.path for a in client.list_artifacts(run_id)}
    assert "logs/trial.log" in {a.path for a in client.list_artifacts(run_id, "logs")}


def test_a_trial_asked_for_a_gpu_is_refused_by_the_cpu_node_not_retried(
    slurm_cluster, ray_session, work_home, sweep_name, monkeypatch
):
    """The training job on a node without CUDA, submitted from a shell that has MASTER_ADDR
    and MASTER_PORT (sbatch passes them on; submitit refused to export over them): refused
    at its device check, naming what it found, once (max_retries: 2)."""
    monkeypatch.setenv("MASTER_ADDR", "192.0.2.1")  # TEST-NET: the submitting host's, say
    monkeypatch.setenv("MASTER_PORT", "29555")
    backend = (
        "{kind: slurm, gpu: H100 SXM, concurrency: 1, max_retries: 2, retry_backoff_s: 0.1, "
        f"slurm: {{partition: {slurm_cluster.partition}, time_min: 5, poll_s: 1}}}}"
    )
    spec, source = parse_spec(sweep_yaml(sweep_name, seeds=1, first_seed=7600, backend=backend))
    (trial,) = expand(spec, source)
    out = run_sweep(spec, [trial], Ledger(spec.name))
    assert out.failed == [trial.trial_id], out
    rec = Ledger(spec.name).records()[trial.trial_id]
    assert rec.tags[Tag.REFUSED] == "1", rec.tags.get(Tag.ERROR)
    assert "the trial's placement asks for a H100 SXM but this torch" in rec.tags[Tag.ERROR]
    assert _sbatch_count(f"scalelab-{sweep_name}") == 1  # not retried
    log = workdir.trial_log(trial.trial_id).read_text()
    assert "MASTER_ADDR=192.0.2.1 from the submitting environment replaced" in log


def test_one_task_failing_ends_the_job_not_the_time_limit(
    slurm_cluster, ray_session, work_home, sweep_name
):
    """Task 1 refuses its node while task 0 waits (as at the rendezvous): the refusing
    task exits 78 and srun runs with --kill-on-bad-exit, so the job ends at once (before,
    task 0 held the job and the test cluster's CPUs until its time limit), and the trial
    is refused, with task 1's reason, not retried (max_retries: 1)."""
    backend = (
        "{kind: slurm, concurrency: 1, max_retries: 1, retry_backoff_s: 0.1, "
        f"slurm: {{partition: {slurm_cluster.partition}, time_min: 5, poll_s: 1, "
        "tasks_per_node: 2}}"
    )
    spec, source = parse_spec(sweep_yaml(sweep_name, seeds=1, first_seed=7700, backend=backend))
    (trial,) = expand(spec, source)
    started = time.monotonic()
    out = run_sweep(spec, [trial], Ledger(spec.name), job="jobs_for_tests:rank_one_refuses")
    assert out.failed == [trial.trial_id], out
    assert time.monotonic() - started < 90  # the time limit is 300 s
    rec = Ledger(spec.name).records()[trial.trial_id]
    assert rec.tags[Tag.REFUSED] == "1", rec.tags.get(Tag.ERROR)
    assert "task 1 found no GPU for seed 7700" in rec.tags[Tag.ERROR]
    assert _sbatch_count(f"scalelab-{sweep_name}") == 1  # not retried


def _sbatch_count(job_name: str) -> int:
    """How many SLURM jobs were ever submitted under this name (accounting, not the queue).
    Accounting records a job a moment after it ends (once, under the full suite's load, not
    yet when the driver was done): none is asked again for up to 10 s."""
    deadline = time.monotonic() + 10
    while True:
        res = subprocess.run(
            ["sacct", "-n", "-X", "-P", f"--name={job_name}", "--format=JobID", "-S", "now-1days"],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        jobs = [line for line in res.stdout.splitlines() if line.strip()]
        if jobs or time.monotonic() > deadline:
            return len(jobs)
        time.sleep(0.5)


def test_a_restarted_driver_reattaches_to_the_running_slurm_job(
    slurm_cluster, ray_session, work_home, sweep_name, tmp_path, monkeypatch
):
    backend = (
        "{kind: slurm, concurrency: 1, max_retries: 0, allow_file_tracking: true, "
        f"slurm: {{partition: {slurm_cluster.partition}, time_min: 5, poll_s: 1}}}}"
    )  # one machine: the sqlite store may stay (orchestrator/tracking_store.py)
    path = tmp_path / "sweep.yaml"
    path.write_text(sweep_yaml(sweep_name, seeds=1, backend=backend))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
        "SCALELAB_TEST_SLEEP": "6",  # the SLURM job inherits it (sbatch exports the env)
    }
    driver = subprocess.Popen(
        [sys.executable, "-m", "scalelab.cli.main", "submit", str(path),
         "--job", "jobs_for_tests:sleepy", "--no-summary"],
        env=env, stdout=subprocess.DEVNULL, stderr=open(tmp_path / "driver.err", "wb"),
        start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 180  # a driver starting under the full suite's load
    rec = None
    while rec is None or calls(work_home, rec.run_id, "start") == 0:  # the job is running
        assert driver.poll() is None, (
            f"the driver ended (exit {driver.returncode}) before it could be killed: "
            f"{(tmp_path / 'driver.err').read_text()[-3000:]}"
        )
        assert time.monotonic() < deadline, f"the SLURM job did not start: {rec}"
        time.sleep(0.3)
        ledger = Ledger(sweep_name)
        recs = ledger.records() if ledger.experiment_id() is not None else {}
        rec = next(iter(recs.values()), None)
        if rec is not None and not rec.tags.get("scalelab.job_ref", "").startswith("slurm:"):
            rec = None  # submitted, but its job id is not recorded yet
    os.killpg(driver.pid, signal.SIGKILL)
    driver.wait()
    job_ref = rec.tags["scalelab.job_ref"]
    job_name = f"scalelab-{sweep_name}"
    state = subprocess.run(
        ["squeue", "-h", "-j", job_ref.removeprefix("slurm:"), "-o", "%T"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    assert state == "RUNNING", f"the SLURM job should outlive its driver, squeue says {state!r}"

    monkeypatch.delenv("SCALELAB_TEST_SLEEP", raising=False)
    result = CliRunner().invoke(
        app, ["submit", str(path), "--job", "jobs_for_tests:sleepy", "--no-summary"]
    )
    assert result.exit_code == 0, result.output
    after = Ledger(sweep_name).records()[rec.trial_id]
    assert after.run_id == rec.run_id and after.status == "FINISHED"
    assert after.tags["scalelab.job_ref"] == job_ref and after.attempts == 1
    assert _sbatch_count(job_name) == 1  # re-attached, not submitted again
    assert calls(work_home, rec.run_id, "start") == 1 and calls(work_home, rec.run_id) == 1


def _steps_logged(curves: Path) -> int:
    if not curves.exists():
        return 0
    return sum('"train/loss"' in line for line in curves.read_text().splitlines())


def test_a_two_task_trial_sent_sigterm_checkpoints_and_requeues_its_job_in_place(
    slurm_cluster, ray_session, work_home, sweep_name, tmp_path
):
    """jobs.training.train on the real SLURM as 2 tasks (srun: one rank per task, the rendezvous on
    the first node from SLURM's environment) gets SIGTERM (`scancel --signal=TERM`, which
    also aborts the job step KillWait + 2 s later; SIGUSR2, the time-limit warning, is
    handled alike): it checkpoints at the end of the step in progress (on nano steps the
    next log step would come in time too: tests/jobs/test_train.py checks which), requeues the same SLURM job and resumes there; the driver follows that job, no retry,
    one MLflow run, no gap or repeat."""
    steps = 40  # time_min: 30, so that SLURM's own warning (30 min - 180 s) never comes
    path = tmp_path / "sweep.yaml"
    path.write_text(f"""
name: {sweep_name}
base:
  model: {{size: nano, vocab_size: 256, block_size: 32}}
  data: {{source: "builtin:pydoc", seq_len: 32, val_tokens: 256}}
  train: {{tokens: {256 * steps}, global_batch_tokens: 256, lr: 3.0e-3, log_interval: 4,
           eval_interval: 1000, checkpoint_interval: 1000}}
backend: {{kind: slurm, concurrency: 1, max_retries: 0,
          slurm: {{partition: {slurm_cluster.partition}, time_min: 30, poll_s: 1,
                   tasks_per_node: 2}}}}
""")
    spec, source = parse_spec(path.read_text(), path)
    (trial,) = expand(spec, source)
    curves = workdir.trial_dir(trial.trial_id) / "curves.jsonl"
    signalled: list[str] = []

    def warn_when_training() -> None:
        deadline = time.monotonic() + 240
        while _steps_logged(curves) < 2:  # step 8
            assert time.monotonic() < deadline, "the trial did not start training"
            time.sleep(0.3)
        ref = Ledger(sweep_name).records()[trial.trial_id].tags[Tag.JOB_REF]
        subprocess.run(["scancel", "--signal=TERM", ref.removeprefix("slurm:")], check=True)
        signalled.append(ref)

    warner = threading.Thread(target=warn_when_training, daemon=True)
    warner.start()
    out = run_sweep(spec, [trial], Ledger(spec.name))
    warner.join(timeout=5)

    assert out.finished == [trial.trial_id] and signalled, out
    rec = Ledger(sweep_name).records()[trial.trial_id]
    assert rec.tags[Tag.JOB_REF] == signalled[0], "the driver followed the same job"
    assert rec.attempts == 1 and Tag.PREEMPTED not in rec.tags
    job_id = signalled[0].removeprefix("slurm:")
    shown = subprocess.run(
        ["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, check=True
    ).stdout.split()
    assert "Restarts=1" in shown, "SLURM requeued the job once"
    client = MlflowClient(tracking_uri())
    assert client.get_run(rec.run_id).data.tags[Tag.WORLD_SIZE] == "2"
    history = client.get_metric_history(rec.run_id, "train/loss")
    assert sorted(m.step for m in history) == list(range(4, steps + 1, 4)), "no gap, no repeat"
    saved = [
        int(c.parent.name[4:]) for c in workdir.trial_dir(trial.trial_id).glob("ckpt/*/COMPLETE")
    ]
    assert any(8 <= step < steps for step in saved), f"checkpointed on the signal: {saved}"
