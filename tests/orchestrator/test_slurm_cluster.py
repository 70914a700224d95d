"""Smoke tests of the local single-node SLURM through submitit, the way the slurm backend uses it.

The cluster is real (scripts/slurm/start.sh): sbatch, slurmctld, slurmd, and sacct backed by
slurmdbd + MariaDB. Job functions are defined here and pickled by value, so the job process
does not need to import this test module.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import cloudpickle
import pytest
import submitit
from submitit.core.utils import UncompletedJobError

TESTS = str(Path(__file__).resolve().parents[1])
if TESTS not in sys.path:  # pytest's importlib mode does not put tests/ on sys.path
    sys.path.insert(0, TESTS)
from slurm_cluster import SlurmCluster, slurm_cluster  # noqa: E402, F401 (fixture)

pytestmark = pytest.mark.slurm

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def weighted_sum(xs: list[int], weight: int) -> dict:
    """Runs inside the SLURM job: the result plus what SLURM told the job about itself."""
    return {
        "value": weight * sum(x * x for x in xs),
        "job_id": os.environ["SLURM_JOB_ID"],
        "array_job_id": os.environ.get("SLURM_ARRAY_JOB_ID"),
        "partition": os.environ["SLURM_JOB_PARTITION"],
        "pid": os.getpid(),
    }


def touch_then_sleep(marker: str, seconds: float) -> str:
    Path(marker).write_text(os.environ["SLURM_JOB_ID"])
    time.sleep(seconds)
    Path(marker + ".finished").write_text("not cancelled")
    return "finished"


class CountToWithRequeue(submitit.helpers.Checkpointable):
    """Counts to `n`, one step per 0.1 s; on preemption submitit checkpoints it and SLURM requeues it.

    The instance is what gets pickled on checkpoint, so the requeued job continues from `done`.
    """

    def __init__(self) -> None:
        self.done = 0
        self.starts: list[tuple[str, int]] = []  # (SLURM_RESTART_COUNT, steps done at start)

    def __call__(self, n: int, marker: str) -> dict:
        self.starts.append((os.environ.get("SLURM_RESTART_COUNT", "0"), self.done))
        Path(marker).write_text(str(len(self.starts)))
        while self.done < n:
            time.sleep(0.1)
            self.done += 1
        return {"done": self.done, "starts": self.starts}


def make_executor(folder: Path, cluster: SlurmCluster) -> submitit.AutoExecutor:
    executor = submitit.AutoExecutor(folder=folder, cluster="slurm")
    assert executor.cluster == "slurm"
    executor.update_parameters(
        slurm_partition=cluster.partition, timeout_min=5, cpus_per_task=1, mem_gb=1
    )
    return executor


def wait_for(predicate, timeout_s: float, what: str) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.2)


def test_job_runs_on_the_cluster_and_returns_its_result(
    slurm_cluster: SlurmCluster,  # noqa: F811
    tmp_path: Path,
) -> None:
    executor = make_executor(tmp_path / "submitit", slurm_cluster)
    job = executor.submit(weighted_sum, [1, 2, 3], weight=7)

    out = job.result()

    assert out["value"] == 7 * (1 + 4 + 9)
    assert out["job_id"] == job.job_id
    assert out["partition"] == slurm_cluster.partition
    assert out["pid"] != os.getpid()
    # sacct (slurmdbd + MariaDB) learns that the job finished (a moment after its result file).
    wait_for(
        lambda: job.watcher.get_state(job.job_id, mode="force") == "COMPLETED",
        30,
        "sacct to report COMPLETED",
    )


def test_cancelled_job_is_reported_cancelled(
    slurm_cluster: SlurmCluster,  # noqa: F811
    tmp_path: Path,
) -> None:
    executor = make_executor(tmp_path / "submitit", slurm_cluster)
    marker = tmp_path / "started"
    job = executor.submit(touch_then_sleep, str(marker), 120)
    wait_for(marker.exists, 30, "the job to start")

    subprocess.run(["scancel", job.job_id], check=True)
    job._results_timeout_s = 2  # the result file would not come: no need for submitit's 15 s wait
    wait_for(lambda: job.done(force_check=True), 30, "sacct to report the job as ended")

    assert job.state.startswith("CANCELLED")
    assert isinstance(job.exception(), UncompletedJobError)
    assert not Path(str(marker) + ".finished").exists()


def test_job_array_returns_every_result(
    slurm_cluster: SlurmCluster,  # noqa: F811
    tmp_path: Path,
) -> None:
    executor = make_executor(tmp_path / "submitit", slurm_cluster)
    xs = [[1], [1, 2], [3, 4, 5], [10]]
    weights = [2, 3, 5, 7]

    jobs = executor.map_array(weighted_sum, xs, weights)
    outs = [job.result() for job in jobs]

    assert [o["value"] for o in outs] == [
        w * sum(x * x for x in v) for v, w in zip(xs, weights, strict=True)
    ]
    array_ids = {job.job_id.split("_")[0] for job in jobs}
    assert len(array_ids) == 1, "map_array must submit one SLURM job array"
    assert {o["array_job_id"] for o in outs} == array_ids
    assert len({o["job_id"] for o in outs}) == len(xs), "each task is its own SLURM job"


@pytest.mark.slow
def test_preempted_checkpointable_job_is_requeued_and_resumes(
    slurm_cluster: SlurmCluster,  # noqa: F811
    tmp_path: Path,
) -> None:
    """Preemption through submitit's interrupt hook (SIGTERM then SIGUSR2), since real SLURM
    time limits are at least a minute: submitit checkpoints, SLURM requeues, the job resumes."""
    executor = make_executor(tmp_path / "submitit", slurm_cluster)
    marker = tmp_path / "starts"
    job = executor.submit(CountToWithRequeue(), 30, str(marker))
    wait_for(marker.exists, 30, "the job to start")
    time.sleep(1.0)  # let it count some steps before preemption

    job._interrupt()

    out = job.result()
    assert out["done"] == 30
    (first, _), (second, resumed_at) = out["starts"]
    assert (first, second) == ("0", "1"), "one start and one requeue (SLURM_RESTART_COUNT)"
    assert 0 < resumed_at < 30, "the requeued job resumed from the checkpoint"


SCRIPTS = Path(__file__).resolve().parents[2] / "scripts" / "slurm"
STATE = Path(os.environ.get("SCALELAB_SLURM_STATE", "/var/lib/scalelab-slurm"))


def process_name(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except FileNotFoundError:
        return None


def test_stop_leaves_alone_a_process_that_took_a_dead_daemons_pid(tmp_path: Path) -> None:
    stranger = subprocess.Popen(["sleep", "300"])
    try:
        pidfile = tmp_path / "slurmd.pid"
        pidfile.write_text(f"{stranger.pid}\n")
        subprocess.run(
            ["bash", "-c", f'source "{SCRIPTS}/lib.sh"; stop_pidfile "$1" slurmd', "_", pidfile],
            check=True,
            timeout=30,
        )
        time.sleep(0.2)
        assert stranger.poll() is None, "stop_pidfile killed a process that is not slurmd"
    finally:
        stranger.kill()
        stranger.wait()


def test_start_restarts_a_daemon_whose_pid_file_names_another_process(
    slurm_cluster: SlurmCluster,  # noqa: F811
) -> None:
    """A pid file outlives its daemon when a machine is restored from a snapshot, and its PID
    can belong to another process by then. CI met exactly this: start.sh took that process for
    slurmd, never started slurmd, and the node stayed 'unknown' until its 60 s timeout."""
    pidfile = STATE / "run" / "slurmd.pid"
    slurmd = int(pidfile.read_text())
    assert process_name(slurmd) == "slurmd"
    stranger = subprocess.Popen(["sleep", "300"])
    try:
        os.kill(slurmd, 15)
        wait_for(lambda: process_name(slurmd) is None, 30, "slurmd to exit")
        pidfile.write_text(f"{stranger.pid}\n")

        proc = subprocess.run(
            ["bash", str(SCRIPTS / "start.sh")],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "SCALELAB_SLURM_TIMEOUT": "20"},
            check=False,
        )

        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "starting slurmd" in proc.stderr
        restarted = int(pidfile.read_text())
        assert restarted != stranger.pid and process_name(restarted) == "slurmd"
        assert stranger.poll() is None
    finally:
        stranger.kill()
        stranger.wait()
        if process_name(int(pidfile.read_text())) != "slurmd":  # leave a working cluster behind
            subprocess.run(["bash", str(SCRIPTS / "start.sh")], capture_output=True, timeout=120)
