"""Training-job overheads: DeepSpeed job vs a plain PyTorch loop, and tracking cost.

    python benchmarks/train.py [--steps 40] [--repeats 3] [--size micro]

1. tokens/s of `jobs.training.train.run` (DeepSpeed engine, ZeRO-0, fp32, data stream, accounting,
   MLflow outbox) against a hand-written torch loop (same model, data, AdamW, clipping);
   goal >= 0.9x. Both run in this process, one thread, alternating, medians of per-step
   times (the first steps are warm-up and dropped).
2. tracking overhead with logging every step: the job with log_interval=1 against
   log_interval=steps, and the direct cost of one Tracker.log call of a full point;
   goal < 2% of step time.
3. On a CUDA device: MFU at the 124M and 1.3B shapes in bf16 (skipped without one).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import torch  # noqa: E402

from scalelab.jobs.config import JobConfig  # noqa: E402


def job_config(size: str, steps: int, log_interval: int, dtype: str = "fp32") -> JobConfig:
    seq_len, seqs = (128, 8) if size in ("nano", "micro", "mini") else (1024, 8)
    vocab = 256 if seqs == 8 and seq_len == 128 else 50304
    return JobConfig.model_validate(
        {
            "model": {"size": size, "vocab_size": vocab, "block_size": seq_len},
            "data": {"source": "builtin:pydoc", "seq_len": seq_len, "val_tokens": seq_len},
            "train": {
                "tokens": steps * seq_len * seqs,
                "global_batch_tokens": seq_len * seqs,
                "dtype": dtype,
                "log_interval": log_interval,
                "eval_interval": 10**9,
                "checkpoint_interval": 10**9,
                "warmup_fraction": 0.0,
            },
        }
    )


def job_step_times(job: JobConfig, home: Path) -> list[float]:
    """Seconds per optimizer step of the real job, from its perf/tokens_per_s points."""
    from scalelab.jobs.training.train import run

    os.environ["SCALELAB_HOME"] = str(home)
    result = run(job)
    rows = [json.loads(x) for x in (home / "trials" / job.trial_id / "curves.jsonl").open()]
    points = [r for r in rows if r["metric"] == "perf/tokens_per_s"]
    per_step = job.train.log_interval * job.train.global_batch_tokens
    assert result.status == "FINISHED"
    return [per_step / r["value"] / job.train.log_interval for r in points]


def plain_step_times(job: JobConfig) -> list[float]:
    """The same training in a plain torch loop (no DeepSpeed, no tracking)."""
    from scalelab.jobs.data.trial import TrainStream, open_data, prepare
    from scalelab.jobs.token_budget import total_steps
    from scalelab.jobs.training.optim import adamw, lr_at
    from scalelab.models.build import build

    root = prepare(job.data, job.seed, job.model)
    data = open_data(job.data, job.seed, root, job.model)
    stream = TrainStream(data, job.seed, job.train.global_batch_tokens // job.data.seq_len, 1, 0, 1)
    torch.manual_seed(job.seed)
    model = build(job.model)
    opt = adamw(model, job.train)
    steps, times = total_steps(job), []
    for step in range(steps):
        t = time.perf_counter()
        for g in opt.param_groups:
            g["lr"] = lr_at(step, steps, job.train)
        (b,) = stream.micro_batches(step)
        out = model(torch.from_numpy(b.x), torch.from_numpy(b.y), progress=step / steps)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), job.train.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        out.task_loss.item()  # the job reads the loss every step too
        times.append(time.perf_counter() - t)
    return times


def tracker_log_cost(n: int = 200) -> float:
    """Seconds per Tracker.log of a full point (16 metrics) against a sqlite store."""
    from scalelab.jobs.tracking.tracker import Tracker

    with tempfile.TemporaryDirectory() as tmp:
        os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{tmp}/mlflow.db"
        tracker = Tracker(Path(tmp) / "trial", enabled=True)
        tracker.start(None, "bench", "bench", {"k": "v"}, {"p": "1"})
        point = {f"group/metric_{i}": 0.5 for i in range(16)}
        t = time.perf_counter()
        for step in range(n):
            tracker.log(step, step, float(step), point)
        cost = (time.perf_counter() - t) / n
        tracker.finish("FINISHED")
        del os.environ["MLFLOW_TRACKING_URI"]
    return cost


def med(xs: list[float], skip: int = 3) -> float:
    return statistics.median(xs[skip:])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--size", default="micro")
    args = ap.parse_args()
    torch.set_num_threads(1)
    tmp = Path(tempfile.mkdtemp(prefix="bench-train-"))
    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{tmp}/mlflow.db"
    every = job_config(args.size, args.steps, log_interval=1)
    rare = job_config(args.size, args.steps, log_interval=10)
    tokens = every.train.global_batch_tokens
    plain, job1, jobN = [], [], []
    for r in range(args.repeats):
        plain.append(statistics.mean(plain_step_times(every)[10:]))
        # equal footing: mean seconds per step over steps 11..N (the first 10 are warm-up)
        job1.append(statistics.mean(job_step_times(every, tmp / f"every{r}")[10:]))
        jobN.append(statistics.mean(job_step_times(rare, tmp / f"rare{r}")[1:]))
    p, j1, jn = statistics.median(plain), statistics.median(job1), statistics.median(jobN)
    log_cost = tracker_log_cost()
    print(f"\nCPU, 1 thread, model {args.size}, {tokens} tokens/step, {args.steps} steps, "
          f"{args.repeats} repeats (median over repeats of the mean s/step after 10 warm-up steps)")  # fmt: skip
    print(f"{'loop':<38}{'s/step':>10}{'tokens/s':>12}{'vs plain':>10}")
    for name, s in (
        ("plain torch loop", p),
        ("jobs.training.train.run (log every step)", j1),
        ("jobs.training.train.run (log every 10 steps)", jn),
    ):
        print(f"{name:<38}{s:>10.4f}{tokens / s:>12.0f}{p / s:>9.2f}x")
    print(f"\ntracking, logging every step: job step time {j1 / jn - 1:+.1%} vs rare logging; "
          f"one Tracker.log of 16 metrics = {log_cost * 1e3:.3f} ms = {log_cost / j1:.2%} "
          f"of a step")  # fmt: skip
    if torch.cuda.is_available():
        gpu_mfu(tmp)
    else:
        print("\nGPU MFU: skipped (no CUDA device)")


def gpu_mfu(tmp: Path) -> None:
    """bf16 MFU of the job at the 124M and 1.3B shapes on this GPU (median over steps)."""
    for size in ("124M", "1.3B"):
        job = job_config(size, steps=30, log_interval=1, dtype="bf16")
        os.environ["SCALELAB_HOME"] = str(tmp / f"gpu-{size}")
        from scalelab.jobs.training.train import run

        run(job)
        rows = [
            json.loads(x) for x in (tmp / f"gpu-{size}/trials/{job.trial_id}/curves.jsonl").open()
        ]
        mfus = [r["value"] for r in rows if r["metric"] == "perf/mfu"]
        print(f"GPU {torch.cuda.get_device_name()} {size} bf16: MFU {med(mfus, 5):.1%}")


if __name__ == "__main__":
    main()
