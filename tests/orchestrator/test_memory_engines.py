"""The planner's parameter + gradient + optimizer bytes per rank (orchestrator/plan/memory.py)
against real DeepSpeed engines on CPU: 1 and 2 gloo ranks, ZeRO 0-3, bf16 and fp32, with and
without optimizer offload, at two model sizes. Each engine is measured by
engine_memory_worker.py; the estimate must be within 10% of what the engine holds, DeepSpeed's
ZeRO-3 gradient bucket must be exactly the estimate's, and a checkpoint's files within 10%
of the estimated checkpoint size."""

import json
from pathlib import Path

import pytest
from forked_ranks import on_ranks

from scalelab.jobs.config import JobConfig
from scalelab.jobs.training.ds_config import deepspeed_config, plan_batch
from scalelab.orchestrator.plan.memory import (
    ZeroSettings,
    checkpoint_bytes,
    model_state_bytes,
    parameter_sizes,
)

WORKER = Path(__file__).with_name("engine_memory_worker.py")


def _job(size: str, stage: int, dtype: str = "bf16", offload: bool = False) -> JobConfig:
    """bf16 accumulates gradients in fp32, except at ZeRO-0 (which allows only bf16)."""
    return JobConfig.model_validate(
        {
            "model": {"size": size, "vocab_size": 256, "block_size": 32},
            "data": {"seq_len": 32},
            "train": {"tokens": 1024, "global_batch_tokens": 256, "dtype": dtype}
            | ({"grad_accum_dtype": "bf16"} if stage == 0 and dtype == "bf16" else {}),
            "deepspeed": {"zero_stage": stage, "offload_optimizer": offload},
        }
    )


# every ZeRO stage, both sizes, fp32 and offload once each (each engine costs ~10 s here)
TWO_RANKS = [
    _job("micro", 0),
    _job("micro", 3),
    _job("mini", 2),
    _job("mini", 3, "bf16", offload=True),
    _job("micro", 2, "fp32"),
    _job("mini", 1, "bf16", offload=True),
]
# ZeRO-1 bf16 (fp32 accumulation: BF16_Optimizer) is the sweeps' setting (sweeps/hadamard.yaml)
ONE_RANK = [_job("micro", 0, "fp32"), _job("mini", 3), _job("micro", 1)]


def _on_two_ranks(jobs: list[JobConfig], tmp_path: Path) -> list[list[dict]]:
    spec, out = tmp_path / "spec.json", tmp_path / "out.json"
    raw = [json.loads(j.model_dump_json()) for j in jobs]
    spec.write_text(json.dumps({"jobs": raw, "dir": str(tmp_path / "ckpt"), "out": str(out)}))
    on_ranks(WORKER, "measure_all", str(spec), env={"SCALELAB_HOME": str(tmp_path / "home")},
             timeout_s=500)  # fmt: skip
    return json.loads(out.read_text())


def _on_one_rank(jobs: list[JobConfig], tmp_path: Path, monkeypatch) -> list[list[dict]]:
    """In this process (no launcher: one rank on 127.0.0.1)."""
    from engine_memory_worker import measure

    from scalelab.jobs.training import distributed

    monkeypatch.setenv("SCALELAB_HOME", str(tmp_path / "home"))
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "SLURM_PROCID"):
        monkeypatch.delenv(key, raising=False)
    env = distributed.read_environment()
    distributed.init(env)
    try:
        return [[measure(job, env, tmp_path / f"ckpt{i}")] for i, job in enumerate(jobs)]
    finally:
        distributed.shutdown(env)


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("ranks", [1, 2])
def test_model_state_bytes_per_rank_match_deepspeed_engines(ranks, tmp_path, monkeypatch):
    if ranks == 2:
        jobs, measured = TWO_RANKS, _on_two_ranks(TWO_RANKS, tmp_path)
    else:
        jobs, measured = ONE_RANK, _on_one_rank(ONE_RANK, tmp_path, monkeypatch)
    for job, per_rank in zip(jobs, measured, strict=True):
        ds = job.deepspeed
        case = f"{job.model.size} ZeRO-{ds.zero_stage} {job.train.dtype} offload={ds.offload_optimizer} x{ranks}"
        z = ZeroSettings.from_ds_config(deepspeed_config(job, plan_batch(job, ranks), "cpu"))
        sizes = parameter_sizes(job.model)
        est = model_state_bytes(sizes, z, ranks)
        for rank, m in enumerate(per_rank):
            assert m["states"] == pytest.approx(est.resident + est.staging, rel=0.10), (case, rank)
            # ZeRO-3 keeps its bucket; ZeRO-1/2 free theirs at the end of each backward
            assert m["buckets"] == (est.buckets if ds.zero_stage == 3 else 0), (case, rank)
        ckpt = per_rank[0]["checkpoint"]  # every rank sees the whole (shared) folder
        assert ckpt == pytest.approx(checkpoint_bytes(sum(sizes), z), rel=0.10), case


def test_zero_settings_defaults_are_deepspeeds():
    from deepspeed.runtime.engine import MEMORY_OPT_ALLREDUCE_SIZE
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    from scalelab.orchestrator.plan.memory import DS_ALLREDUCE_PIECE

    assert DS_ALLREDUCE_PIECE == MEMORY_OPT_ALLREDUCE_SIZE  # BF16_Optimizer's all-reduce pieces
    for stage in (1, 3):
        theirs = DeepSpeedZeroConfig(stage=stage)
        ours = ZeroSettings.from_ds_config({"zero_optimization": {"stage": stage}})
        assert ours.reduce_bucket_size == theirs.reduce_bucket_size
        assert ours.overlap_comm == theirs.overlap_comm
        assert ours.contiguous_gradients == theirs.contiguous_gradients
        assert ours.persistence_threshold == theirs.param_persistence_threshold
        assert ours.prefetch_bucket_size == theirs.prefetch_bucket_size
