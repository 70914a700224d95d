"""Real DeepSpeed on CPU with 2 gloo ranks under torchrun: ZeRO 1, 2 and 3 follow the
single-process loss curve of the same seed and global batch, and really shard the
optimizer state."""

import json
import os
import subprocess
import sys

import pytest
import torch
from two_ranks import train_on_two_ranks

from scalelab.jobs.training.train import run


def _exp_avg_numel(obj) -> int:
    """Elements of every Adam first-moment tensor in a (nested) optimizer state."""
    if isinstance(obj, dict):
        return sum(
            v.numel() if k == "exp_avg" and torch.is_tensor(v) else _exp_avg_numel(v)
            for k, v in obj.items()
        )
    if isinstance(obj, (list, tuple)):
        return sum(_exp_avg_numel(v) for v in obj)
    return 0


@pytest.mark.slow
@pytest.mark.distributed
def test_zero_stages_match_single_process_and_shard(home, tmp_path, tiny_job, curve):
    job = tiny_job(deepspeed__micro_batch_size=2)  # 2 ranks x 2 micro x 2 accumulation steps
    reference = run(job)  # one process, one micro-batch of 8 sequences
    ref_loss = curve(home, job.trial_id, "train/loss")

    stages = (1, 2, 3)
    homes = [tmp_path / f"zero{z}" for z in stages]
    jobs = [job.model_copy(update={"deepspeed": job.deepspeed.model_copy(update={"zero_stage": z})})
            for z in stages]  # fmt: skip
    results = train_on_two_ranks(list(zip(homes, jobs, strict=True)), tmp_path)

    for z, result, home in zip(stages, results, homes, strict=True):
        assert result["status"] == "FINISHED" and result["steps"] == reference.steps
        loss = curve(home, job.trial_id, "train/loss")
        assert [s for s, _ in loss] == [s for s, _ in ref_loss]
        for (_, a), (_, b) in zip(loss, ref_loss, strict=True):
            assert a == pytest.approx(b, rel=2e-5), f"ZeRO-{z}"
        assert result["final_val_loss"] == pytest.approx(reference.final_val_loss, rel=2e-5)

        ckpt = next((home / "trials" / job.trial_id / "ckpt").glob("step*"))
        shards = sorted(ckpt.glob("*optim_states.pt"))
        assert len(shards) == 2, f"ZeRO-{z}: one optimizer shard per rank"
        per_rank = [_exp_avg_numel(torch.load(p, weights_only=False)) for p in shards]
        for n in per_rank:  # each rank holds half of Adam's state (plus alignment padding)
            assert 0.49 * reference.n_params <= n <= 0.52 * reference.n_params, (z, per_rank)


@pytest.mark.slow
@pytest.mark.distributed
def test_the_process_groups_timeout_is_the_jobs_setting(tmp_path):
    """deepspeed.dist_timeout_minutes reaches the group the job starts: a rank 6 s late
    fails a barrier set to time out after 1.2 s (torch's default would wait 30 min)."""
    import json

    from forked_ranks import on_ranks
    from two_ranks import WORKER

    from scalelab.jobs.config import DeepSpeedConfig

    assert DeepSpeedConfig().dist_timeout_minutes == 30  # documented in docs/training.md
    out = tmp_path / "out.json"
    on_ranks(WORKER, "late_rank", str(out), "0.02")
    ended = json.loads(out.read_text())
    assert ended["outcome"] != "met" and "timed out" in ended["outcome"].lower()
    assert ended["waited_s"] < 5


def test_a_slurm_jobs_port_is_its_own_and_below_the_ephemeral_ports():
    """submitit drew 20000-60000, where a port lent to an outgoing connection made rank 0's
    store fail with EADDRINUSE (seen in the suite: job 139, port 42278)."""
    from scalelab.jobs.training.distributed import slurm_port

    ports = [slurm_port(str(job)) for job in range(100, 20100)]
    assert all(20000 <= p < 32768 for p in ports)  # Linux's ephemeral ports start at 32768
    assert slurm_port("139") == slurm_port("139") != slurm_port("140")
    assert len(set(ports)) == len(range(20000, 32768))  # every port of the range in use
    assert slurm_port("4242_7") == slurm_port("42427")  # an array task's id


# A task of a SLURM job on one node as submitit starts it, and what the shell that submitted
# the job had exported (an earlier torchrun's): sbatch passes it on to every task.
SLURM_TASK = {"SUBMITIT_EXECUTOR": "slurm", "SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURM_NTASKS": "4",
              "SLURM_PROCID": "3", "SLURM_LOCALID": "3", "SLURM_NODEID": "0",
              "SLURM_JOB_NUM_NODES": "1", "SLURM_JOB_NODELIST": "localhost"}  # fmt: skip
SUBMITTING_SHELL = {"RANK": "0", "WORLD_SIZE": "1", "MASTER_PORT": "29511"}


def _as_slurm_task(code: str, task: dict[str, str]) -> subprocess.CompletedProcess:
    """`python -c code` started as srun starts a task: SLURM_TASK_PID is its pid."""
    launchers = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                 "MASTER_PORT", "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in launchers and "SLURM" not in k}
    return subprocess.run(
        ["sh", "-c", 'export SLURM_TASK_PID=$$; exec "$0" -c "$1"', sys.executable, code],
        env=env | task, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_a_slurm_task_is_slurms_rank_whatever_the_submitting_shell_exported():
    """Every task of a job submitted from a shell with RANK=0 WORLD_SIZE=1 MASTER_PORT set
    trained as rank 0 of 1 (each its own model) and met on that port: SLURM's rank, world
    size and the job's own port win, in the trial logs' rank too."""
    from scalelab.jobs.training.distributed import slurm_port

    code = (
        "import json\n"
        "from scalelab.jobs.tracking.trial_logs import launcher_rank\n"
        "from scalelab.jobs.training.distributed import read_environment\n"
        "log_rank = launcher_rank()\n"
        "e = read_environment()\n"
        "print(json.dumps([e.rank, e.world_size, e.local_rank, e.master_port, e.launcher, "
        "log_rank]))\n"
    )
    done = _as_slurm_task(code, SLURM_TASK | SUBMITTING_SHELL)
    assert done.returncode == 0, done.stderr
    port = slurm_port("4242")
    assert json.loads(done.stdout.splitlines()[-1]) == [3, 4, 3, port, "slurm", 3]
    assert "RANK=0 WORLD_SIZE=1 from the submitting environment ignored" in done.stderr
    assert f"MASTER_PORT=29511 from the submitting environment replaced by the job's port {port}" in done.stderr  # fmt: skip


def test_ranks_a_launcher_starts_inside_a_slurm_task_keep_their_own(tmp_path):
    """jobs/training/local_ranks.py inside a SLURM task (a trial of 2 ranks in one task)
    whose shell had RANK=0 WORLD_SIZE=1: each rank is the launcher's, not the task's."""
    rank_code = (
        "import json, sys\n"
        "from scalelab.jobs.training.distributed import read_environment\n"
        "e = read_environment()\n"
        "open(sys.argv[1] + str(e.rank), 'w').write(json.dumps([e.world_size, e.launcher]))\n"
    )
    code = (
        "import sys\n"
        "from scalelab.jobs.training.local_ranks import run_local_ranks\n"
        f"sys.exit(run_local_ranks([sys.executable, '-c', {rank_code!r}, "
        f"{str(tmp_path / 'rank')!r}], 2))\n"
    )
    task = SLURM_TASK | {"SLURM_NTASKS": "1", "SLURM_PROCID": "0", "SLURM_LOCALID": "0"}
    done = _as_slurm_task(code, task | SUBMITTING_SHELL)
    assert done.returncode == 0, done.stderr
    for rank in (0, 1):
        assert json.loads((tmp_path / f"rank{rank}").read_text()) == [2, "env"]
