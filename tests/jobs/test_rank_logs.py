"""Issue 26, item 8: a trial of several ranks writes one log per rank, rank 0's is the
trial's log, and only rank 0 attaches the logs to the run. Real DeepSpeed on 2 gloo ranks,
each started as a SLURM job starts its tasks: its own process calling jobs.launch.launch.
Issue 27, item 1: each rank's log has the job's progress lines (jobs/training/progress.py)."""

import os
import socket
import subprocess
import sys
import time

import pytest
from mlflow.tracking import MlflowClient
from progress_lines import progress_lines

from scalelab.contract.workdir import trial_log

pytestmark = [pytest.mark.slow, pytest.mark.distributed]

TASK = """
import sys
from scalelab.jobs.launch import DEFAULT_JOB, launch
job_json, run_id, artifact_uri = open(sys.argv[1]).read(), sys.argv[2], sys.argv[3]
print("outcome", launch(DEFAULT_JOB, job_json, run_id, artifact_uri=artifact_uri)["status"])
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_each_rank_writes_its_own_log_and_rank_0_attaches_them_once(
    home, mlflow_uri, tiny_job, tmp_path
):
    # a progress line after every step: each takes longer than a millisecond
    job = tiny_job(train__tokens=256 * 4, deepspeed__zero_stage=1, train__progress_interval_s=1e-3)
    (tmp_path / "job.json").write_text(job.model_dump_json())
    client = MlflowClient(mlflow_uri)
    run_id = client.create_run(client.get_experiment_by_name("Default").experiment_id).info.run_id
    port, procs = _free_port(), []
    for rank in (0, 1):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2",
               "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}  # fmt: skip
        art = (tmp_path / f"artifacts-of-rank{rank}").as_uri()  # where each would attach
        cmd = [sys.executable, "-c", TASK, str(tmp_path / "job.json"), run_id, art]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True))
    live = []  # progress lines seen in the trial's log while its rank 0 still ran
    deadline = time.monotonic() + 300
    while procs[0].poll() is None and not live and time.monotonic() < deadline:
        if trial_log(job.trial_id).exists():
            live = progress_lines(trial_log(job.trial_id).read_text())
        time.sleep(0.05)
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert all("outcome FINISHED" in o for o in outs), outs

    logs = home / "trials" / job.trial_id / "logs"
    assert sorted(p.name for p in logs.iterdir()) == ["rank1.log", "trial.log"]
    rank0, rank1 = trial_log(job.trial_id).read_text(), trial_log(job.trial_id, 1).read_text()
    assert rank0.startswith("==== ") and f"run {run_id} " in rank0 and " rank 1" not in rank0
    assert " rank 1\n" in rank1.splitlines(keepends=True)[0]
    assert rank1.count("\n") > 1  # what rank 1 printed (torch's warnings) is in its own log
    attached = tmp_path / "artifacts-of-rank0"
    assert sorted(p.name for p in (attached / "logs").iterdir()) == ["rank1.log", "trial.log"]
    assert (attached / "job.json").exists()
    assert not (tmp_path / "artifacts-of-rank1").exists()  # rank 1 attached nothing

    lines = progress_lines(rank0)
    assert live and live[0] == lines[0]  # written as it happened, not at the end
    assert [p["step"] for p in lines] == [1, 2, 3, 4] and {p["steps"] for p in lines} == {4}
    assert [p["tokens"] for p in lines] == [256 * p["step"] for p in lines]
    assert all(p["loss"] > 0 and p["tokens/s"] > 0 and p["eta"] >= 0 for p in lines)
    assert "mfu" not in lines[0]  # CPUs have no peak
    assert lines[-1]["eta"] == 0 and lines[-1]["elapsed"] >= lines[0]["elapsed"]
    others = progress_lines(rank1)  # rank 1's, in its own log: the same steps and mean losses
    assert [(p["step"], p["loss"]) for p in others] == [(p["step"], p["loss"]) for p in lines]
    assert progress_lines((attached / "logs" / "trial.log").read_text()) == lines
