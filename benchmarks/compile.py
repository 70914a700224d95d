"""torch.compile (inductor) against eager, per variant, side by side (issue 26).

    OMP_NUM_THREADS=1 python -m benchmarks.compile [--size nano] [--batch 8] [--seq 128]
        [--repeats 15] [--variants dense,hadamard,...] [--device cuda --dtype bf16]
        [--vocab 256]

For each variant (dense and every mechanism combination, models/catalog.py): one model
eager and a copy compiled with inductor; the compile + first forward/backward timed once,
then forward + backward of a training step, eager and compiled alternately
(benchmarks/timing.py): medians of wall and process CPU time, the ratio, and the largest
loss difference between the two over the timed steps (the same weights, inputs and noise).
The vocabulary is the CPU sweeps' bytes (256) unless --vocab says otherwise.
Paste the table into docs/benchmarks.md ("torch.compile per variant"). On a GPU the GPU
acceptance check runs `compare` for the ladder's variants at the ladder's vocabulary
(benchmarks/acceptance/compile_speed.py).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from dataclasses import dataclass

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

from benchmarks.timing import interleaved_times  # noqa: E402
from scalelab.models import catalog  # noqa: E402
from scalelab.models.build import build  # noqa: E402
from scalelab.models.config import ModelConfig  # noqa: E402

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class Row:
    variant: str
    compile_s: float  # compile + the first forward and backward
    eager_ms: float  # median wall time of forward + backward
    compiled_ms: float
    eager_cpu_ms: float  # median process CPU time (one thread: excludes time descheduled)
    compiled_cpu_ms: float
    loss_diff: float  # max |compiled - eager| loss over the timed steps

    @property
    def speedup(self) -> float:
        return self.eager_ms / self.compiled_ms


def compare(
    variant: str,
    size: str,
    batch: int,
    seq: int,
    repeats: int,
    device: str,
    dtype: str,
    vocab: int = 256,
) -> Row:
    import torch._dynamo
    import torch._inductor.config

    torch._inductor.config.fallback_random = True  # budget's Gumbel noise: eager's stream
    fields = catalog.variant_fields(variant)
    cfg = ModelConfig(size=size, vocab_size=vocab, block_size=seq, **fields)
    torch.manual_seed(0)
    eager = build(cfg, device=device).to(DTYPES[dtype]).train()
    fast = build(cfg, device=device).to(DTYPES[dtype]).train()
    fast.load_state_dict(eager.state_dict())
    x = torch.randint(0, vocab, (batch, seq), device=device)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    losses: dict[str, list[float]] = {"eager": [], "compiled": []}
    torch._dynamo.reset()
    compiled = torch.compile(fast, backend="inductor")

    def step(name: str, forward: torch.nn.Module, model: torch.nn.Module):
        def run() -> None:
            torch.manual_seed(len(losses[name]))
            loss = forward(x, x).loss
            loss.backward()
            model.zero_grad(set_to_none=True)
            losses[name].append(loss.detach())

        return run

    t0 = time.perf_counter()
    step("compiled", compiled, fast)()
    sync()
    compile_s = time.perf_counter() - t0
    step("eager", eager, eager)()  # the same step 0, for the loss comparison
    steps = {"eager": step("eager", eager, eager), "compiled": step("compiled", compiled, fast)}
    wall, cpu = interleaved_times(steps, repeats, sync)
    diff = max(
        abs(float(a) - float(b)) for a, b in zip(losses["eager"], losses["compiled"], strict=True)
    )
    med = {k: 1e3 * statistics.median(v) for k, v in wall.items()}
    med_cpu = {k: 1e3 * statistics.median(v) for k, v in cpu.items()}
    return Row(variant, compile_s, med["eager"], med["compiled"], med_cpu["eager"],
               med_cpu["compiled"], diff)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", default="nano")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--variants", default=",".join(catalog.variants()))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="fp32", choices=sorted(DTYPES))
    parser.add_argument("--vocab", type=int, default=256, help="256: the CPU sweeps' bytes")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), {args.device} "
          f"{args.dtype}, {args.size}, vocabulary {args.vocab}, batch {args.batch} x "
          f"{args.seq}, median of {args.repeats}, load {os.getloadavg()}")  # fmt: skip
    print(
        "| variant | compile + first step s | eager ms | compiled ms | eager / compiled "
        "(wall) | eager CPU ms | compiled CPU ms | eager / compiled (CPU) | max loss diff |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for variant in args.variants.split(","):
        r = compare(variant, args.size, args.batch, args.seq, args.repeats, args.device,
                    args.dtype, args.vocab)  # fmt: skip
        print(f"| {r.variant} | {r.compile_s:.0f} | {r.eager_ms:.1f} | {r.compiled_ms:.1f} | "
              f"{r.speedup:.2f}x | {r.eager_cpu_ms:.1f} | {r.compiled_cpu_ms:.1f} | "
              f"{r.eager_cpu_ms / r.compiled_cpu_ms:.2f}x | {r.loss_diff:.1e} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
