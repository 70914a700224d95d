"""Checkpoint I/O at ladder scale, on what this machine has (docs/benchmarks.md,
"Checkpoint digests and asynchronous saves"):

1. digests: a checkpoint-shaped folder (one big model file, one shard per rank) hashed by
   one rank on 1 thread against `checksums.hash_threads()` threads;
2. saves: how long `checkpoint.save` holds the training loop, synchronous against
   `train.async_checkpoint` (the wait for the background writer counted apart), on a
   ZeRO-1 bf16 engine of one rank.

Cases run alternately (benchmarks/timing.py); medians of the repeats.

    python benchmarks/checkpoint_io.py [--mb 256] [--shards 4] [--size 124M] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import interleaved_times  # noqa: E402


def digests(mb: int, shards: int, repeats: int) -> None:
    from scalelab.jobs.training import checksums

    folder = Path(tempfile.mkdtemp())
    try:
        names = ["mp_rank_00_model_states.pt"]
        (folder / names[0]).write_bytes(os.urandom(mb << 20))
        for r in range(shards):
            names.append(f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt")
            (folder / names[-1]).write_bytes(os.urandom((mb // 2) << 20))
        total = sum((folder / n).stat().st_size for n in names) / 2**20
        threads = checksums.hash_threads()
        wall, _ = interleaved_times(
            {
                "1 thread": lambda: checksums.digests(folder, names, 1),
                f"{threads} threads": lambda: checksums.digests(folder, names, threads),
            },
            repeats,
        )
        base = statistics.median(wall["1 thread"])
        print(f"\n{len(names)} files, {total:.0f} MiB (page cache):")
        print("| digests | s | MiB/s | vs 1 thread |\n|---|---|---|---|")
        for name, times in wall.items():
            t = statistics.median(times)
            print(f"| {name} | {t:.3f} | {total / t:,.0f} | {base / t:.2f}x |")
    finally:
        shutil.rmtree(folder)


def saves(size: str, repeats: int) -> None:
    from scalelab.jobs.config import JobConfig
    from scalelab.jobs.training import checkpoint, distributed
    from scalelab.jobs.training.ds_config import plan_batch
    from scalelab.jobs.training.train import _Trainer

    home = Path(tempfile.mkdtemp())
    os.environ["SCALELAB_HOME"] = str(home)
    job = JobConfig.model_validate(
        {
            "model": {"size": size, "vocab_size": 256, "block_size": 64},
            "data": {"seq_len": 64},
            "train": {"tokens": 4096, "global_batch_tokens": 256, "dtype": "bf16"},
            "deepspeed": {"zero_stage": 1},
        }
    )
    env = distributed.read_environment()
    distributed.init(env)
    try:
        trainer = _Trainer(job, env, plan_batch(job, 1), time.time())
        trainer._build_engine()
        writer = checkpoint.BackgroundWriter(timeout_s=600)
        step = iter(range(1, 10**6))
        held: dict[str, list[float]] = {"writer's wait": []}

        def async_save() -> None:
            checkpoint.save(trainer.engine, env, home / "ckpt", {"step": next(step)}, 1, writer)
            t0 = time.perf_counter()
            writer.wait()  # timed apart: the loop would train meanwhile
            held["writer's wait"].append(time.perf_counter() - t0)

        wall, _ = interleaved_times(
            {
                "synchronous": lambda: checkpoint.save(
                    trainer.engine, env, home / "ckpt", {"step": next(step)}, 1
                ),
                "async_checkpoint (loop held)": async_save,
            },
            repeats,
        )
        size_mb = sum(p.stat().st_size for p in checkpoint.latest(home / "ckpt").iterdir()) / 2**20
        wall["async_checkpoint (loop held)"] = [
            t - w
            for t, w in zip(
                wall["async_checkpoint (loop held)"], held["writer's wait"][1:], strict=True
            )  # fmt: skip
        ]
        wall["async: writer's time after"] = held["writer's wait"][1:]
        base = statistics.median(wall["synchronous"])
        print(f"\nmodel {size}, ZeRO-1 bf16, 1 rank, checkpoint {size_mb:.1f} MiB:")
        print("| save | s | vs synchronous |\n|---|---|---|")
        for name, times in wall.items():
            t = statistics.median(times)
            print(f"| {name} | {t:.3f} | {t / base:.2f}x |")
    finally:
        distributed.shutdown(env)
        shutil.rmtree(home, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=int, default=256, help="the model file's MiB")
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--size", default="124M")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    digests(args.mb, args.shards, args.repeats)
    saves(args.size, args.repeats)


if __name__ == "__main__":
    main()
