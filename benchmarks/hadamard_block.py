"""Attention block, forward + backward: Hadamard output projection against dense W_O.

    python benchmarks/hadamard_block.py [--threads 2] [--batch 4] [--seq 256] [--repeats 5]
                                        [--scopes attn,block] [--shapes 124M,1.3B]

Scopes (both built from models/gpt.py's `Block`, so the code measured is the model's own):
  attn  : x + Attn(LN(x)) -- LayerNorm, QKV projection, causal SDPA, output mixing, residual
  block : the full pre-norm transformer Block (attention update, then the 4x GELU MLP)
Shapes: the 124M preset (d=768, 12 heads) and the 1.3B preset (d=2048, 16 heads); one
block of each, with the init of a model of that depth (alpha and W_O depend on n_layer).

Per row: median and min wall time, and median process CPU time (all threads; on a shared
machine it is far less disturbed by other jobs than wall time), of forward + backward
(gradients w.r.t. the input and every parameter) over `repeats`, dense and Hadamard run
alternately; the parameter count; and memory:
  act MiB  : activations autograd keeps between forward and backward (saved_tensors_hooks,
             one count per storage, parameters excluded) -- exact and allocator-independent;
  peak MiB : CPU: the rise of the peak RSS (VmHWM, reset through /proc/self/clear_refs)
             over one forward + backward after a warm-up one, in a fresh subprocess per
             row, with glibc told to mmap every allocation over 64 KiB (so freed memory
             leaves RSS at once); it includes the new parameter gradients. GPU: torch.cuda.max_memory_allocated
             minus the memory held before the step.
x-columns are hadamard / dense (< 1: Hadamard is faster / smaller).

GPU section (bf16, when CUDA is present) uses a larger batch; without CUDA it prints a
skip line. Paste the output into docs/benchmarks.md ("Hadamard attention block").
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace

import torch
from torch import Tensor, nn

from benchmarks.timing import interleaved_times
from scalelab.models.config import ModelConfig
from scalelab.models.context import ForwardContext
from scalelab.models.gpt import GPT, Block

SHAPES = ("124M", "1.3B")
VARIANTS = ("dense", "hadamard")
SCOPES = ("attn", "block")


@dataclass(frozen=True)
class Row:
    shape: str
    scope: str
    variant: str
    params: int
    ms: float
    min_ms: float
    cpu_ms: float  # process CPU time (all threads): less sensitive to other jobs' load
    act_mib: float
    peak_mib: float | None


def build(shape: str, variant: str, scope: str, device: str, dtype: torch.dtype) -> nn.Module:
    """One Block of the `shape` preset, initialised as in a full GPT of that depth."""
    cfg = ModelConfig(size=shape, vocab_size=256, block_size=1024, attn_out=variant)
    block = Block(cfg, 0)
    # GPT's own init (std 0.02, residual projections 0.02/sqrt(2L)) and mechanisms' post_init
    block.apply(functools.partial(GPT._init_weights, SimpleNamespace(cfg=cfg)))
    for module in block.modules():
        if hasattr(module, "post_init"):
            module.post_init()
    if scope == "attn":  # the MLP does not run: keep it out of autograd
        for p in [*block.ln_2.parameters(), *block.mlp.parameters()]:
            p.requires_grad_(False)
    return block.to(device=device, dtype=dtype)


def scope_params(block: Block, scope: str) -> list[nn.Parameter]:
    if scope == "attn":
        return [*block.ln_1.parameters(), *block.attn.parameters()]
    return list(block.parameters())


def step_fn(block: Block, scope: str, x: Tensor, grad: Tensor) -> Callable[[], None]:
    """One forward + backward of the chosen scope (gradients are dropped, not accumulated)."""
    params = scope_params(block, scope)

    def forward() -> Tensor:
        ctx = ForwardContext()
        if scope == "attn":
            return x + block.attn_update(x, ctx)
        return block(x, ctx)

    def step() -> None:
        for p in params:
            p.grad = None
        x.grad = None
        forward().backward(grad)

    step.forward = forward  # type: ignore[attr-defined]
    return step


def saved_activation_bytes(forward: Callable[[], Tensor], params: list[Tensor]) -> int:
    """Bytes autograd saves for backward during one forward (each storage once), not
    counting parameters (they live on whether or not backward needs them)."""
    param_storages = {p.untyped_storage().data_ptr() for p in params}
    storages: dict[int, int] = {}

    def pack(t: Tensor) -> Tensor:
        s = t.untyped_storage()
        if s.data_ptr() not in param_storages:
            storages[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = forward()
    del out
    return sum(storages.values())


def inputs(
    shape: str, batch: int, seq: int, device: str, dtype: torch.dtype
) -> tuple[Tensor, Tensor]:
    d = ModelConfig(size=shape).d_model
    gen = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(batch, seq, d, generator=gen, device=device, dtype=dtype, requires_grad=True)
    grad = torch.randn(batch, seq, d, generator=gen, device=device, dtype=dtype)
    return x, grad


def cpu_peak_rss_mib(
    shape: str, variant: str, scope: str, batch: int, seq: int, threads: int
) -> float:
    """Peak-RSS increase of one forward + backward, in a fresh process per row. glibc is
    told to serve every allocation over 64 KiB by mmap, so freed memory goes back to the OS
    at once and RSS follows the live tensors rather than malloc's caches."""
    cmd = [sys.executable, __file__, "--_rss", shape, variant, scope, str(batch), str(seq)]
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "OMP_NUM_THREADS": str(threads)}
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])["peak_mib"]


def _proc_status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _rss_child(shape: str, variant: str, scope: str, batch: int, seq: int) -> None:
    block = build(shape, variant, scope, "cpu", torch.float32)
    x, grad = inputs(shape, batch, seq, "cpu", torch.float32)
    step = step_fn(block, scope, x, grad)
    step()  # warm-up: one-time allocations (BLAS workspaces, thread pools) are not the model's
    for p in block.parameters():
        p.grad = None
    x.grad = None
    before = _proc_status_kib("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM (the peak RSS) to the current RSS (Linux >= 4.0)
    step()
    peak = _proc_status_kib("VmHWM")
    print(json.dumps({"peak_mib": (peak - before) / 1024}))


def measure_pair(
    shape: str,
    scope: str,
    batch: int,
    seq: int,
    repeats: int,
    device: str,
    dtype: torch.dtype,
    threads: int,
) -> list[Row]:
    """Dense and Hadamard rows of one (shape, scope), timed alternately."""
    x, grad = inputs(shape, batch, seq, device, dtype)
    blocks = {v: build(shape, v, scope, device, dtype) for v in VARIANTS}
    steps = {v: step_fn(blocks[v], scope, x, grad) for v in VARIANTS}
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    wall, cpu = interleaved_times(steps, repeats, sync)
    rows = []
    for v in VARIANTS:
        params = list(blocks[v].parameters())
        act = saved_activation_bytes(steps[v].forward, params) / 2**20  # type: ignore[attr-defined]
        if device == "cuda":
            for p in blocks[v].parameters():
                p.grad = None
            x.grad = None
            sync()
            held = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            steps[v]()
            sync()
            peak = (torch.cuda.max_memory_allocated() - held) / 2**20
        else:
            peak = cpu_peak_rss_mib(shape, v, scope, batch, seq, threads)
        n_params = sum(p.numel() for p in scope_params(blocks[v], scope))
        ms, min_ms = statistics.median(wall[v]) * 1e3, min(wall[v]) * 1e3
        cpu_ms = statistics.median(cpu[v]) * 1e3
        rows.append(Row(shape, scope, v, n_params, ms, min_ms, cpu_ms, act, peak))
    return rows


HEADER = (
    f"{'shape':>6} {'scope':>5} {'variant':>8} {'params':>11} {'median ms':>10} {'min ms':>8} "
    f"{'cpu ms':>8} {'act MiB':>8} {'peak MiB':>9} {'x time':>7} {'x min':>6} {'x cpu':>6} "
    f"{'x params':>8} {'x act':>6} {'x peak':>7}"
)


def format_row(r: Row, dense: Row) -> str:
    ratios = [""] * 6
    if r.variant != "dense":
        ratios = [
            f"{r.ms / dense.ms:.3f}",
            f"{r.min_ms / dense.min_ms:.3f}",
            f"{r.cpu_ms / dense.cpu_ms:.3f}",
            f"{r.params / dense.params:.3f}",
            f"{r.act_mib / dense.act_mib:.3f}",
            f"{r.peak_mib / dense.peak_mib:.3f}" if r.peak_mib and dense.peak_mib else "n/a",
        ]
    peak = f"{r.peak_mib:.1f}" if r.peak_mib is not None else "n/a"
    return (
        f"{r.shape:>6} {r.scope:>5} {r.variant:>8} {r.params:>11,} {r.ms:>10.1f} "
        f"{r.min_ms:>8.1f} {r.cpu_ms:>8.1f} {r.act_mib:>8.1f} {peak:>9} {ratios[0]:>7} "
        f"{ratios[1]:>6} {ratios[2]:>6} {ratios[3]:>8} {ratios[4]:>6} {ratios[5]:>7}"
    )


def run_section(
    device: str,
    dtype: torch.dtype,
    batch: int,
    seq: int,
    repeats: int,
    shapes: list[str],
    scopes: list[str],
    threads: int,
) -> None:
    print(HEADER, flush=True)
    for shape in shapes:
        for scope in scopes:
            dense, had = measure_pair(shape, scope, batch, seq, repeats, device, dtype, threads)
            print(format_row(dense, dense), flush=True)
            print(format_row(had, dense), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch", type=int, default=4, help="CPU batch (sequences)")
    parser.add_argument("--seq", type=int, default=256, help="CPU sequence length")
    parser.add_argument("--gpu-batch", type=int, default=8)
    parser.add_argument("--gpu-seq", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--scopes", default=",".join(SCOPES))
    parser.add_argument("--_rss", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args._rss:
        shape, variant, scope, batch, seq = args._rss
        torch.set_num_threads(args.threads)
        _rss_child(shape, variant, scope, int(batch), int(seq))
        return
    torch.set_num_threads(args.threads)
    shapes, scopes = args.shapes.split(","), args.scopes.split(",")
    print(
        f"CPU fp32, batch {args.batch} x seq {args.seq}, {torch.get_num_threads()} threads, "
        f"median and min of {args.repeats}"
    )
    run_section(
        "cpu", torch.float32, args.batch, args.seq, args.repeats, shapes, scopes, args.threads
    )
    print()
    if not torch.cuda.is_available():
        print("GPU section skipped: no CUDA device on this machine")
        return
    print(
        f"GPU bf16 ({torch.cuda.get_device_name()}), batch {args.gpu_batch} x seq "
        f"{args.gpu_seq}, median and min of {args.repeats}"
    )
    run_section(
        "cuda",
        torch.bfloat16,
        args.gpu_batch,
        args.gpu_seq,
        args.repeats,
        shapes,
        scopes,
        args.threads,
    )


if __name__ == "__main__":
    main()
