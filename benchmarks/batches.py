"""Training batches (issue 26, item 6a): the step time with today's batches against
contiguous ones, and contiguous ones read one step ahead on a background thread.

    python benchmarks/batches.py [--size micro] [--seq-len 256] [--micro 16] [--accum 2]
                                 [--repeats 30]

One optimizer step = `accum` micro-batches of the trial's stream (jobs/data/reader.py, real
prepared builtin:pydoc tokens) through a plain torch model (forward, backward, clipping,
fused AdamW), one compute thread. The three ways of reading, side by side in one process,
alternating (benchmarks/timing.py):

  today      : the reader before issue 26: np.stack of the windows, astype(int64), x and y
               as strided views of it; torch.from_numpy keeps the strides, read on the
               training thread
  contiguous : the reader now: x and y each widened into its own C-contiguous array, read
               on the training thread (jobs/data/device_inputs.prefetched, ahead=0)
  read ahead : the same, read on a background thread up to one step (`accum` micro-batches)
               ahead (prefetched, ahead=accum), as jobs/training/train.py does

A second table times the reading alone (one micro-batch to host tensors), today's against
contiguous. On a GPU the copies would also go through pinned memory; **not measured: no GPU**
here. Paste the output into docs/benchmarks.md ("Training batches").
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from benchmarks.timing import interleaved_times  # noqa: E402
from scalelab.jobs.config import DataConfig, TrainConfig  # noqa: E402
from scalelab.jobs.data.device_inputs import prefetched  # noqa: E402
from scalelab.jobs.data.reader import TokenWindows, TrainStream  # noqa: E402
from scalelab.jobs.data.trial import open_data, prepare  # noqa: E402
from scalelab.models.config import ModelConfig  # noqa: E402

Inputs = tuple[torch.Tensor, torch.Tensor, dict]


def today_batches(stream: TrainStream, data: TokenWindows, first: int) -> Iterator[Inputs]:
    """The reader and device inputs before issue 26 (jobs/data/reader.py, device_inputs.py)."""
    tokens, L = data.split["train"], data.seq_len
    for step in range(first, 10**9):
        base = step * stream.global_batch
        for a in range(stream.accum):
            start = base + (a * stream.world + stream.rank) * stream.micro
            idx = stream.windows(np.arange(start, start + stream.micro, dtype=np.int64))
            w = np.stack([tokens.read(int(j) * L, L + 1) for j in idx]).astype(np.int64)
            yield torch.from_numpy(w[:, :-1]), torch.from_numpy(w[:, 1:]), {}


def micro_batches(stream: TrainStream, first: int):
    for step in range(first, 10**9):
        yield from stream.micro_batches(step)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="micro")
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--micro", type=int, default=16)
    ap.add_argument("--accum", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=30)
    args = ap.parse_args()
    torch.set_num_threads(1)
    os.environ.setdefault("SCALELAB_HOME", tempfile.mkdtemp(prefix="bench-batches-"))
    from scalelab.jobs.training.optim import adamw
    from scalelab.models.build import build

    L, accum = args.seq_len, args.accum
    model_cfg = ModelConfig(size=args.size, vocab_size=256, block_size=L)
    cfg = DataConfig(seq_len=L, val_tokens=L)
    data = open_data(cfg, 0, prepare(cfg, 0, model_cfg), model_cfg)
    stream = TrainStream(data, seed=0, micro_batch=args.micro, accum=accum, rank=0, world=1)
    torch.manual_seed(0)
    model = build(model_cfg)
    opt = adamw(model, TrainConfig(tokens=1))

    def trainer(inputs: Iterator[Inputs]) -> Callable[[], None]:
        def step() -> None:
            for _ in range(accum):
                x, y, kw = next(inputs)
                (model(x, y, **kw).loss / accum).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)

        return step

    cases = {
        "today": trainer(today_batches(stream, data, 0)),
        "contiguous": trainer(prefetched(micro_batches(stream, 0), "cpu")),
        "read ahead": trainer(prefetched(micro_batches(stream, 0), "cpu", ahead=accum)),
    }
    wall, cpu = interleaved_times(cases, args.repeats)

    def read_today() -> None:
        next(reads_today)

    def read_new() -> None:
        next(reads_new)

    reads_today = today_batches(stream, data, 0)
    reads_new = prefetched(micro_batches(stream, 0), "cpu")
    rw, _ = interleaved_times({"today": read_today, "contiguous": read_new}, args.repeats * 4)

    tokens = args.micro * accum * L
    print(f"\nmachine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
          f"torch {torch.__version__}, load average {os.getloadavg()[0]:.1f}; "
          f"model {args.size}, seq_len {L}, {args.micro} x {accum} micro-batches = {tokens} "
          f"tokens/step, 1 compute thread, {args.repeats} steps per case, alternating")  # fmt: skip
    base = statistics.median(wall["today"])
    print("\n| batches | step (median) | CPU s (median) | tokens/s | speed vs today |")
    print("|---|---:|---:|---:|---:|")
    for name in cases:
        s, c = statistics.median(wall[name]), statistics.median(cpu[name])
        print(
            f"| {name} | {s * 1e3:.1f} ms | {c * 1e3:.1f} ms | {tokens / s:,.0f} | {base / s:.3f}x |"
        )
    rb = statistics.median(rw["today"])
    print(
        f"\n| reading one micro-batch ({args.micro} x {L + 1} tokens) | median | speed vs today |"
    )
    print("|---|---:|---:|")
    for name in rw:
        r = statistics.median(rw[name])
        print(f"| {name} | {r * 1e6:.0f} us | {rb / r:.2f}x |")
    x, _, _ = next(today_batches(stream, data, 0))
    print(f"\ntoday's x: contiguous={x.is_contiguous()} stride={x.stride()}; now: contiguous=True")
    print("GPU (pinned, non-blocking copies): not measured: no GPU" if not torch.cuda.is_available()
          else "GPU present: not measured by this script")  # fmt: skip


if __name__ == "__main__":
    main()
