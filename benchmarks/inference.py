"""Inference with the KV cache (models/decode.py): every variant against dense, one run.

    OMP_NUM_THREADS=1 nice -n 19 python benchmarks/inference.py [--sizes mini micro]
        [--prompt 128] [--new 32] [--prefill-batch 8] [--repeats 5] [--threads 1]

Per size preset and variant, all in one process and interleaved (each repeat runs every
variant in turn, so load from other processes hits them alike):
Times are the thread's CPU time with one CPU thread (on a loaded machine that leaves out
the waits for a core), else wall time (after a synchronize on a GPU).
- prefill: tokens/s of one cached forward over a (prefill-batch x prompt) batch;
- decode: latency of each single-token step after the prompt, p50 / p90 over the steps of
  every repeat, at batch 1 and 16;
- memory: the weights (tied weights once) and the KV cache allocated for prompt + new
  tokens at batch 16, exact bytes; on a GPU also the peak allocated during decode.
Ratios are against dense at the same size (lower latency / memory is better, higher
throughput is better). The mechanisms run at a stated operating point (an untrained
model's decisions say nothing about a trained one's): BudgetFormer at its initial budget
s = 0.5 (k = H/2 heads per token), TSA with its routers' output bias set so that the
routed token-layers that run are alpha = 0.726 (the TSA paper's matched operating point,
--tsa-alpha); the executed fractions measured on the prefill batch are printed with the
table. CPU presets use the CPU sweeps' byte vocabulary (256; --vocab); GPU shapes (124M, 1.3B in bf16, GPT-2's 50257) run only where CUDA is present.
Paste the output into docs/benchmarks.md ("Inference").
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from dataclasses import dataclass

import torch

from scalelab.models import catalog
from scalelab.models.build import build
from scalelab.models.config import ModelConfig
from scalelab.models.decode import KVCache, forward_cached

DECODE_BATCHES = (1, 16)


@dataclass
class Case:
    variant: str
    model: torch.nn.Module
    weight_bytes: int
    prefill_s: list[float]
    decode_s: dict[int, list[float]]
    cache_bytes: int = 0
    peak_bytes: int = 0
    executed: dict[str, list[float]] | None = None


def operating_point(model: torch.nn.Module, tokens: torch.Tensor, alpha: float) -> None:
    """TSA: one output bias for every router, found by bisection, at which the routed
    token-layers that run on `tokens` are `alpha` (the TSA paper's matched alpha)."""
    if model.cfg.tsa is None:
        return
    routers = model.depth.routers
    for router in routers:
        torch.nn.init.normal_(router.out.weight, std=1.0)
    low, high = -20.0, 20.0  # bias: higher halts more tokens (alpha falls)
    for _ in range(30):
        mid = (low + high) / 2
        for router in routers:
            torch.nn.init.constant_(router.out.bias, mid)
        if executed_fraction(model, tokens)["alpha"] > alpha:
            low = mid
        else:
            high = mid


def build_case(
    size: str, variant: str, block: int, device: str, dtype: torch.dtype, args: argparse.Namespace
) -> Case:
    torch.manual_seed(0)
    cfg = ModelConfig(
        size=size, vocab_size=args.vocab, block_size=block, **catalog.variant_fields(variant)
    )
    model = build(cfg, device=device).to(dtype).eval()
    calibration = torch.randint(
        0, args.vocab, (8, args.prompt), generator=torch.Generator().manual_seed(2)
    )
    operating_point(model, calibration.to(device), args.tsa_alpha)
    weights = sum(p.nbytes for p in {id(p): p for p in model.parameters()}.values())
    return Case(variant, model, weights, [], {b: [] for b in DECODE_BATCHES}, executed={})


def executed_fraction(model: torch.nn.Module, tokens: torch.Tensor) -> dict[str, float]:
    """Executed heads per token (BudgetFormer) and routed token-layers (TSA alpha) of a
    full forward over `tokens`, from the model's own eval metrics."""
    with torch.no_grad():
        metrics = model(tokens).metrics
    out = {}
    if "budget/heads_active" in metrics:
        out["heads"] = float(metrics["budget/heads_active"])
    if "tsa/alpha" in metrics:
        out["alpha"] = float(metrics["tsa/alpha"])
    return out


def run_size(size: str, args: argparse.Namespace, device: str, dtype: torch.dtype) -> list[Case]:
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    # one CPU thread: its CPU time (leaves out the time it waited for a core on a loaded
    # machine); else wall time (after a synchronize on a GPU)
    one_thread = device == "cpu" and torch.get_num_threads() == 1
    clock = time.thread_time if one_thread else time.perf_counter
    capacity = args.prompt + args.new
    cases = [build_case(size, v, capacity, device, dtype, args) for v in args.variants]
    gen = torch.Generator().manual_seed(1)
    prompt = {
        b: torch.randint(0, args.vocab, (b, args.prompt), generator=gen).to(device)
        for b in (*DECODE_BATCHES, args.prefill_batch)
    }
    steps = torch.randint(0, args.vocab, (max(DECODE_BATCHES), args.new), generator=gen).to(device)
    for case in cases:
        case.executed = executed_fraction(case.model, prompt[args.prefill_batch])
    for repeat in range(args.repeats + 1):  # repeat 0 warms up (allocator, kernels)
        for case in cases:
            cache = KVCache.allocate(case.model, args.prefill_batch, args.prompt)
            sync()
            t0 = clock()
            forward_cached(case.model, prompt[args.prefill_batch], cache, logits="last")
            sync()
            if repeat:
                case.prefill_s.append(clock() - t0)
            for b in DECODE_BATCHES:
                cache = KVCache.allocate(case.model, b, capacity)
                forward_cached(case.model, prompt[b], cache, logits="last")
                if device == "cuda":
                    torch.cuda.reset_peak_memory_stats()
                for t in range(args.new):
                    sync()
                    t0 = clock()
                    forward_cached(case.model, steps[:b, t : t + 1], cache, logits="last")
                    sync()
                    if repeat:
                        case.decode_s[b].append(clock() - t0)
                if b == max(DECODE_BATCHES):
                    case.cache_bytes = cache.nbytes
                    if device == "cuda":
                        case.peak_bytes = torch.cuda.max_memory_allocated()
                del cache
    return cases


def quantile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[int(q * 100) - 1]


def print_table(size: str, cases: list[Case], args: argparse.Namespace, device: str) -> None:
    dense = next(c for c in cases if c.variant == "dense")
    prefill_tokens = args.prefill_batch * args.prompt

    def tok_s(c: Case) -> float:
        return prefill_tokens / statistics.median(c.prefill_s)

    print(
        f"\n{size}: prefill {args.prefill_batch} x {args.prompt} tokens, decode {args.new} "
        f"tokens after a {args.prompt}-token prompt, {args.repeats} repeats, {device}"
    )
    head = "| variant | prefill tok/s (x dense) |"
    for b in DECODE_BATCHES:
        head += f" decode b{b} p50 ms (x dense) | b{b} p90 ms |"
    head += " weights MB (x dense) | KV cache b16 MB |"
    if device == "cuda":
        head += " peak b16 MB (x dense) |"
    head += " executed |"
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for c in cases:
        row = f"| {c.variant} | {tok_s(c):,.0f} ({tok_s(c) / tok_s(dense):.2f}) |"
        for b in DECODE_BATCHES:
            p50, p90 = quantile(c.decode_s[b], 0.5), quantile(c.decode_s[b], 0.9)
            base = quantile(dense.decode_s[b], 0.5)
            row += f" {p50 * 1e3:.2f} ({p50 / base:.2f}) | {p90 * 1e3:.2f} |"
        row += f" {c.weight_bytes / 2**20:.1f} ({c.weight_bytes / dense.weight_bytes:.3f}) |"
        row += f" {c.cache_bytes / 2**20:.1f} |"
        if device == "cuda":
            row += f" {c.peak_bytes / 2**20:.0f} ({c.peak_bytes / dense.peak_bytes:.3f}) |"
        done = ", ".join(f"{k} {v:.2f}" for k, v in (c.executed or {}).items()) or "all"
        row += f" {done} |"
        print(row)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["micro", "mini"])
    parser.add_argument("--gpu-sizes", nargs="+", default=["124M", "1.3B"])
    parser.add_argument("--variants", nargs="+", default=catalog.variants())
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--new", type=int, default=32)
    parser.add_argument("--prefill-batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--vocab", type=int, default=256, help="CPU presets' vocabulary (the CPU sweeps' bytes)"
    )
    parser.add_argument("--tsa-alpha", type=float, default=0.726, help="TSA operating point")
    args = parser.parse_args()
    if "dense" not in args.variants:
        args.variants = ["dense", *args.variants]
    torch.set_num_threads(args.threads)
    print(
        f"machine: {platform.processor() or platform.machine()}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} thread(s); CPU fp32, vocabulary {args.vocab}"
    )
    for size in args.sizes:
        print_table(size, run_size(size, args, "cpu", torch.float32), args, "cpu")
    if not torch.cuda.is_available():
        print(f"\nGPU ({', '.join(args.gpu_sizes)}): not measured: no CUDA device here")
        return
    print(f"\nGPU: {torch.cuda.get_device_name()}, bf16")
    gpu = {"prompt": 512, "new": 128, "prefill_batch": 16, "vocab": 50257}  # GPT-2 BPE
    gpu = argparse.Namespace(**{**vars(args), **gpu})
    for size in args.gpu_sizes:
        print_table(size, run_size(size, gpu, "cuda", torch.bfloat16), gpu, "cuda")


if __name__ == "__main__":
    main()
