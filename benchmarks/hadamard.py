"""Hadamard transform benchmarks: the fast transform against what it replaces.

    python benchmarks/hadamard.py [--threads 2] [--tokens 8192] [--repeats 7]

CPU: torch FWHT path vs the dense d x d matmul (x @ W_O) for d in {768, 1024, 2048, 4096},
fp32, medians over repeats. GPU (when CUDA is present): the Triton kernel vs a
device-to-device copy of the same bf16 tensor, d in 1024..16384. Paste the output into
docs/benchmarks.md ("Hadamard kernels").
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from scalelab.kernels.hadamard import hadamard_transform, torch_plan


def median_seconds(fn, repeats: int, sync=lambda: None) -> float:
    fn()  # warm-up: caches, allocator, autotuning
    sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def cpu_table(tokens: int, repeats: int) -> None:
    print(f"CPU fp32, {tokens} tokens, {torch.get_num_threads()} threads, median of {repeats}")
    print(f"{'d':>6} {'stages':>14} {'fwht ms':>9} {'dense ms':>9} {'dense/fwht':>11}")
    gen = torch.Generator().manual_seed(0)
    for d in (768, 1024, 2048, 4096):
        x = torch.randn(tokens, d, generator=gen)
        w = torch.randn(d, d, generator=gen) / d**0.5
        fwht = median_seconds(lambda x=x: hadamard_transform(x, backend="torch"), repeats)
        dense = median_seconds(lambda x=x, w=w: x @ w, repeats)
        stages = "x".join(str(order) for order, _ in torch_plan(d))
        print(f"{d:>6} {stages:>14} {fwht * 1e3:>9.1f} {dense * 1e3:>9.1f} {dense / fwht:>10.1f}x")


def gpu_table(repeats: int) -> None:
    if not torch.cuda.is_available():
        print("GPU section skipped: no CUDA device on this machine")
        return
    print(f"GPU bf16 ({torch.cuda.get_device_name()}), median of {repeats}")
    print(f"{'d':>6} {'rows':>7} {'triton us':>10} {'copy us':>9} {'GB/s':>7} {'triton/copy':>12}")
    for d in (1024, 2048, 4096, 8192, 16384):
        rows = (256 << 20) // (2 * d)  # 256 MiB of bf16 in, 256 MiB out
        x = torch.randn(rows, d, device="cuda", dtype=torch.bfloat16)
        out = torch.empty_like(x)
        sync = torch.cuda.synchronize
        had = median_seconds(lambda x=x: hadamard_transform(x), repeats, sync)
        copy = median_seconds(lambda x=x, out=out: out.copy_(x), repeats, sync)
        gbs = 2 * x.numel() * x.element_size() / had / 1e9
        print(
            f"{d:>6} {rows:>7} {had * 1e6:>10.0f} {copy * 1e6:>9.0f} {gbs:>7.0f} {had / copy:>11.2f}x"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cpu_table(args.tokens, args.repeats)
    print()
    gpu_table(args.repeats)


if __name__ == "__main__":
    main()
