"""Real DeepSpeed on CPU with 2 gloo ranks under torchrun: ZeRO 1, 2 and 3 follow the
single-process loss curve of the same seed and global batch, and really shard the
optimizer state."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from jobs.train import run

WORKER = Path(__file__).with_name("dist_worker.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
    runs = [
        {"home": str(tmp_path / f"zero{z}"),
         "job": json.loads(job.model_copy(update={"deepspeed": job.deepspeed.model_copy(
             update={"zero_stage": z})}).model_dump_json())}
        for z in stages
    ]  # fmt: skip
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"runs": runs, "out": str(tmp_path / "out.json")}))
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
         "--master_addr", "127.0.0.1", "--master_port", str(_free_port()), str(WORKER), str(spec)],
        env={**env, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=400,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = json.loads((tmp_path / "out.json").read_text())

    for z, result, item in zip(stages, results, runs, strict=True):
        assert result["status"] == "FINISHED" and result["steps"] == reference.steps
        loss = curve(Path(item["home"]), job.trial_id, "train/loss")
        assert [s for s, _ in loss] == [s for s, _ in ref_loss]
        for (_, a), (_, b) in zip(loss, ref_loss, strict=True):
            assert a == pytest.approx(b, rel=2e-5), f"ZeRO-{z}"
        assert result["final_val_loss"] == pytest.approx(reference.final_val_loss, rel=2e-5)

        ckpt = next((Path(item["home"]) / "trials" / job.trial_id / "ckpt").glob("step*"))
        shards = sorted(ckpt.glob("*optim_states.pt"))
        assert len(shards) == 2, f"ZeRO-{z}: one optimizer shard per rank"
        per_rank = [_exp_avg_numel(torch.load(p, weights_only=False)) for p in shards]
        for n in per_rank:  # each rank holds half of Adam's state (plus alignment padding)
            assert 0.49 * reference.n_params <= n <= 0.52 * reference.n_params, (z, per_rank)
