"""BudgetFormer inference: time and FLOPs of budgeted attention at fixed k/H vs all heads.

    python benchmarks/budget.py --threads 2 [--d-model 768 --heads 8 --seq 256 --batch 16]

For each k/H in {1/8, 1/4, 1/2, 1}, the all-heads MultiHeadAttention (SDPA over all H
heads, dense W_O) against BudgetAttention.sparse_forward with k heads per decision:
  encoder (task=classify): one decision per example, either the same head set for every
    example ('shared') or an independent random set per example ('random');
  decoder (task=lm): one decision per query token, the same set for every token ('shared')
    or an independent random set per token ('random'; K/V then run for the union of heads,
    which is every head at these sizes, so the FLOP ratio is higher).
All cases of one task are timed round-robin (one call of each per round), so the machine's
noise hits them alike; the table shows medians over --reps rounds. Goal (issue 5): time
falls at least 0.7x as fast as FLOPs, i.e. time ratio <= 1 - 0.7 * (1 - FLOP ratio).
'ok' judges the process-CPU-time ratio with --threads 1 (on a shared machine it does not
count time spent descheduled) and the wall-time ratio otherwise.
"""

from __future__ import annotations

import argparse
import platform
import statistics
from collections.abc import Callable

import torch

from benchmarks.timing import interleaved_times
from scalelab.models.budget_flops import budget_inference_flops
from scalelab.models.config import ModelConfig
from scalelab.models.context import ForwardContext
from scalelab.models.mechanism import Seam


def selection(shape: tuple[int, ...], H: int, k: int, random: bool) -> torch.Tensor:
    """Boolean (..., H) masks with exactly k heads: random per decision, or one shared set."""
    scores = torch.rand(*shape, H) if random else torch.rand(H).expand(*shape, H)
    top = scores.topk(k, dim=-1).indices
    return torch.zeros(*shape, H, dtype=torch.bool).scatter_(-1, top, True)


def attention_layer(cfg: ModelConfig) -> torch.nn.Module:
    """Layer 0's attention as GPT builds it: head selection around the output mixing."""
    out_proj = cfg.component(Seam.OUTPUT_MIXING).build(cfg, 0)
    return cfg.component(Seam.HEAD_SELECTION).build(cfg, 0, out_proj)


def bench_task(task: str, a: argparse.Namespace) -> None:
    H, B, T, d = a.heads, a.batch, a.seq, a.d_model
    extra = {"task": "classify", "n_classes": 2} if task == "classify" else {}
    base = dict(size="124M", n_layer=1, d_model=d, n_head=H, block_size=T)
    cfg = ModelConfig(**base, budget={}, **extra)
    dense = ModelConfig(**base, **extra)
    full = attention_layer(dense).eval()
    budgeted = attention_layer(cfg).eval()
    budgeted.load_state_dict(full.state_dict(), strict=False)
    x = torch.randn(B, T, d)
    ctx = ForwardContext()
    decisions = (B, 1) if task == "classify" else (B, T)
    cases: dict[str, tuple[torch.Tensor, float]] = {}
    f_full = budget_inference_flops(cfg, [torch.full(decisions, H)], T, [torch.full((B,), H)])
    for k in sorted({max(1, H // 8), H // 4, H // 2, H}):
        for mode in ("shared", "random"):
            if k == H and mode == "random":
                continue
            active = selection(decisions, H, k, mode == "random")
            union = active.flatten(0, 1).any(0).sum().expand(B)  # K/V heads run (decoder)
            flops = budget_inference_flops(cfg, [active.sum(-1)], T, [union])
            cases[f"{k}/{H} {mode}"] = (active, flops / f_full)
    fns: dict[str, Callable[[], object]] = {"all heads": lambda: full(x, ctx)}
    for name, (active, _) in cases.items():
        fns[name] = lambda a_=active: budgeted.sparse_forward(x, a_, ctx)
    with torch.no_grad():
        wall, cpu = interleaved_times(fns, a.reps)
    ms = {name: 1e3 * statistics.median(ts) for name, ts in wall.items()}
    cpu_ms = {name: 1e3 * statistics.median(ts) for name, ts in cpu.items()}
    label = "encoder (one decision per example)" if task == "classify" else "decoder (per token)"
    print(f"\n## {label}: all heads {ms['all heads']:.2f} ms ({cpu_ms['all heads']:.2f} CPU)\n")
    print("| k/H | heads | FLOP ratio | time (ms) | time ratio | CPU ratio | goal <= | ok |")
    print("|---|---|---|---|---|---|---|---|")
    for name, (_, flop_ratio) in cases.items():
        kh, mode = name.split()
        ratio = ms[name] / ms["all heads"]
        cpu_ratio = cpu_ms[name] / cpu_ms["all heads"]
        goal = 1 - 0.7 * (1 - flop_ratio)
        judged = cpu_ratio if a.threads == 1 else ratio  # see the module docstring
        ok = "yes" if judged <= goal + 1e-9 else "no"
        print(
            f"| {kh} | {mode} | {flop_ratio:.3f} | {ms[name]:.2f} | {ratio:.3f} "
            f"| {cpu_ratio:.3f} | {goal:.3f} | {ok} |"
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--d-model", type=int, default=768)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--task", choices=["classify", "lm", "both"], default="both")
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    print(
        f"# {platform.processor() or platform.machine()}, torch {torch.__version__}, "
        f"threads={a.threads}, d={a.d_model}, H={a.heads}, T={a.seq}, B={a.batch}, "
        f"median of {a.reps} round-robin rounds"
    )
    for task in ("classify", "lm") if a.task == "both" else (a.task,):
        bench_task(task, a)


if __name__ == "__main__":
    main()
