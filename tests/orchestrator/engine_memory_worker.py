"""One rank of test_memory_engines.py (started by tests/forked_ranks.py, or `measure` in the
test's own process): what real DeepSpeed engines hold.

measure_all(SPEC.json), SPEC: {"jobs": [JobConfig, ...], "dir": "...", "out": "results.json"}

Each job's engine is built the way jobs/training/train.py builds it, takes two optimizer steps on
random tokens, and right after the last backward pass (parameters, gradients and optimizer
states all exist then) every tensor storage reachable from the engine is summed once; the
ones DeepSpeed keeps in its gradient buckets (`ipg_*`) are summed apart. Then a checkpoint
is saved with jobs.training.checkpoint.save and its files summed. Rank 0 writes, per job, each
rank's numbers.
"""

import json
import time
from pathlib import Path

import torch
import torch.distributed as dist

from benchmarks.engine_memory import held_bytes
from scalelab.jobs.config import JobConfig
from scalelab.jobs.training import checkpoint, distributed
from scalelab.jobs.training.ds_config import plan_batch
from scalelab.jobs.training.train import _Trainer


def measure(job: JobConfig, env: distributed.DistEnv, ckpt_dir: Path) -> dict:
    trainer = _Trainer(job, env, plan_batch(job, env.world_size), time.time())
    trainer._build_engine()
    engine, plan = trainer.engine, trainer.plan
    torch.manual_seed(env.rank)
    held = (0, 0)
    for step in range(2):
        for micro in range(plan.accum):
            x = torch.randint(0, job.model.vocab_size, (plan.micro_batch, job.data.seq_len))
            engine.backward(engine(x, x).loss)
            if step == 1 and micro == plan.accum - 1:
                held = held_bytes(engine)
            engine.step()
    states, buckets = held
    tag = checkpoint.save(engine, env, ckpt_dir, {"step": 2}, keep=1)
    files = sum(p.stat().st_size for p in tag.iterdir() if p.is_file())
    return {"states": states, "buckets": buckets, "checkpoint": files}


def measure_all(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    env = distributed.read_environment()
    distributed.init(env)
    results = []
    for i, raw in enumerate(spec["jobs"]):
        numbers = measure(JobConfig.model_validate(raw), env, Path(spec["dir"]) / f"job{i}")
        gathered = [None] * env.world_size
        dist.all_gather_object(gathered, numbers)
        results.append(gathered)
    if env.is_main:
        Path(spec["out"]).write_text(json.dumps(results))
    distributed.shutdown(env)
