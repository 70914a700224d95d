"""BudgetFormer inference: time and FLOPs of budgeted attention at fixed k/H vs all heads.

    python benchmarks/budget.py --threads 2 [--d-model 768 --heads 8 --seq 256 --batch 16]

For each k/H in {1/8, 1/4, 1/2, 1}: the all-heads MultiHeadAttention (SDPA over all H heads,
dense W_O) against BudgetAttention.sparse_forward with k heads selected per example, either
the same head set for every example ('shared') or an independent random set per example
('per-example'). Medians of --reps timed runs after warm-up. The goal (issue 5): wall time
falls at least 0.7x as fast as FLOPs, i.e. time ratio <= 1 - 0.7 * (1 - FLOP ratio).
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch

from models.attention import MultiHeadAttention
from models.budget import BudgetAttention
from models.config import ModelConfig
from models.context import ForwardContext
from models.flops import budget_inference_flops


def median_ms(fn, reps: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--d-model", type=int, default=768)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--task", choices=["classify", "lm"], default="classify")
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    extra = {"task": "classify", "n_classes": 2} if a.task == "classify" else {}
    base = dict(size="124M", n_layer=1, d_model=a.d_model, n_head=a.heads, block_size=a.seq)
    cfg = ModelConfig(**base, budget={}, **extra)
    full = MultiHeadAttention(ModelConfig(**base, **extra), 0).eval()
    budgeted = BudgetAttention(cfg, 0).eval()
    budgeted.load_state_dict(full.state_dict(), strict=False)
    x = torch.randn(a.batch, a.seq, a.d_model)
    ctx = ForwardContext()
    H, B, T = a.heads, a.batch, a.seq
    print(
        f"# {platform.processor() or platform.machine()}, torch {torch.__version__}, "
        f"threads={a.threads}, task={a.task}, d={a.d_model}, H={H}, T={T}, B={B}, "
        f"median of {a.reps}"
    )
    with torch.no_grad():
        t_full = median_ms(lambda: full(x, ctx), a.reps)
        f_full = budget_inference_flops(cfg, [torch.full((B,), H)], T, [torch.full((B,), H)])
        print(f"all heads: {t_full:.2f} ms")
        print("| k/H | selection | FLOP ratio | time (ms) | time ratio | goal <= | ok |")
        print("|---|---|---|---|---|---|---|")
        for k in sorted({max(1, H // 8), H // 4, H // 2, H}):
            for mode in ("shared", "per-example"):
                scores = torch.rand(B, H) if mode == "per-example" else torch.rand(1, H)
                top = scores.topk(k, dim=-1).indices
                active = torch.zeros(scores.shape, dtype=torch.bool).scatter_(1, top, True)
                active = active.expand(B, H).unsqueeze(1)  # one decision per example
                t = median_ms(lambda a_=active: budgeted.sparse_forward(x, a_, ctx), a.reps)
                kk = torch.full((B,), k)
                flop_ratio = (budget_inference_flops(cfg, [kk], T, [kk]) / f_full) if k else 0
                goal = 1 - 0.7 * (1 - flop_ratio)
                ok = "yes" if t / t_full <= goal + 1e-9 else "no"
                print(
                    f"| {k}/{H} | {mode} | {flop_ratio:.3f} | {t:.2f} | {t / t_full:.3f} | "
                    f"{goal:.3f} | {ok} |"
                )


if __name__ == "__main__":
    main()
