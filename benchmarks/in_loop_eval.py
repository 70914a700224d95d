"""What `eval.in_loop` costs a trial: the demo's trials trained with and without tasks scored
at every validation, side by side on CPU.

    OMP_NUM_THREADS=1 python benchmarks/in_loop_eval.py [--sizes nano tiny micro]
        [--tasks scalelab_zen piqa arc_easy] [--items 100] [--repeats 3]

Each trial is the demo sweep's dense trial of that size at its larger budget (98,304 tokens:
96 steps of 1,024 tokens, `eval_interval` 32, so three validations), trained in this
process by the real job, once without `eval.in_loop` and once with it, interleaved per
repeat (the trial's folder removed between runs, the prepared data kept). Reported: the
median wall time of each arm, their ratio, and the in-loop scoring's own share of the trial
with it (the sum of its `downstream/seconds` over the wall time), which is the overhead the
noise of a shared machine does not blur.

A second table counts the tokens one in-loop evaluation runs forward (every choice with its
question, in the byte tokenizer of the demo and GPT-2's of the ladder sweeps) and puts
their forward FLOPs (2 N a token) beside the training FLOPs between two validations (6 N a
token): at the demo's interval (32 steps of 1,024 tokens) and at the ladder sweeps' (250
steps of 524,288 tokens, sweeps/hadamard.yaml at 124M). Paste both into docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import tempfile
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from scalelab.jobs.config import JobConfig  # noqa: E402


def demo_job(size: str, in_loop: dict | None) -> JobConfig:
    spec = {
        "model": {"size": size, "vocab_size": 256, "block_size": 64},
        "data": {"source": "builtin:pydoc", "tokenizer": "byte", "seq_len": 64,
                 "val_tokens": 8192},
        "train": {"tokens": 98304, "global_batch_tokens": 1024, "lr": 1e-3,
                  "log_interval": 8, "eval_interval": 32, "checkpoint_interval": 32},
    }  # fmt: skip
    if in_loop:
        spec["eval"] = {"in_loop": in_loop}
    return JobConfig.model_validate(spec)


def train_once(job: JobConfig) -> tuple[float, float]:
    """(wall s of the trial, seconds its in-loop scoring took) on a fresh trial folder."""
    from scalelab.contract.workdir import trial_dir
    from scalelab.jobs.training.train import run

    shutil.rmtree(trial_dir(job.trial_id), ignore_errors=True)
    result = run(job)
    assert result.status == "FINISHED", result
    curves = trial_dir(job.trial_id) / "curves.jsonl"
    rows = [json.loads(line) for line in curves.read_text().splitlines()]
    in_loop = sum(r["value"] for r in rows if r["metric"] == "downstream/seconds")
    return result.wall_time_s, in_loop


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", nargs="+", default=["nano", "tiny", "micro"])
    p.add_argument("--tasks", nargs="+", default=["scalelab_zen", "piqa", "arc_easy"])
    p.add_argument("--items", type=int, default=100)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    home = Path(tempfile.mkdtemp(prefix="in-loop-bench-"))
    os.environ["SCALELAB_HOME"] = str(home)
    os.environ.setdefault("MLFLOW_TRACKING_URI", f"sqlite:///{home / 'mlflow.db'}")
    os.environ["SCALELAB_EXPERIMENT"] = "bench-in-loop"
    wanted = {"tasks": args.tasks, "items": args.items}
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
          f"OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}; tasks {', '.join(args.tasks)}, "
          f"{args.items} items each; median of {args.repeats}")  # fmt: skip
    print("| size | without s | with s | ratio | in-loop scoring s | its share of the trial |")
    print("|---|---|---|---|---|---|")
    for size in args.sizes:
        plain, with_tasks = demo_job(size, None), demo_job(size, wanted)
        train_once(plain)  # the data prepared, the first-run costs paid
        without, with_, scoring = [], [], []
        for _ in range(args.repeats):
            without.append(train_once(plain)[0])
            wall, spent = train_once(with_tasks)
            with_.append(wall)
            scoring.append(spent / wall)
        a, b = statistics.median(without), statistics.median(with_)
        spent = statistics.median(s * w for s, w in zip(scoring, with_, strict=True))
        print(f"| {size} | {a:.1f} | {b:.1f} | {b / a:.3f} | {spent:.2f} | "
              f"{statistics.median(scoring):.1%} |", flush=True)  # fmt: skip
    flop_shares(args.tasks, args.items)


def flop_shares(tasks: list[str], items: int) -> None:
    """The forward tokens of one in-loop evaluation and their FLOPs' share (module doc)."""
    from scalelab.jobs.data.tokenizers import load_tokenizer
    from scalelab.jobs.downstream.in_loop import load_tasks

    loaded = load_tasks(tasks, items)
    intervals = {"demo (32 x 1,024)": 32 * 1024, "ladder (250 x 524,288)": 250 * 524288}
    print("\n| tokenizer | forward tokens | " + " | ".join(f"FLOP share, {k}" for k in intervals)
          + " |")  # fmt: skip
    print("|---|---|" + "---|" * len(intervals))
    for name in ("byte", "gpt2"):
        tok = load_tokenizer(name)
        texts = [c + x for t in loaded for q in t.questions for c, x in q.requests]
        tokens = sum(len(ids) for ids in tok.encode_batch(texts))
        shares = " | ".join(f"{2 * tokens / (6 * n):.3%}" for n in intervals.values())
        print(f"| {name} | {tokens:,} | {shares} |")


if __name__ == "__main__":
    main()
