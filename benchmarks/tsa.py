"""TSA: sparse against dense inference wall time, and soft-gating training overhead.

Model: the 'mini' preset (6 layers, d_model 256, 8 heads), vocabulary 256 (character LM),
sequence 256. The routers are biased to reach a target active fraction alpha: each router's
last layer gets N(0, 1) weights and a bias set, layer by layer on a calibration batch, to
the quantile that leaves `alpha` of the tokens active (p <= 0.5). The backbone weights are
the initial ones; the time of a forward pass does not depend on their values.

Columns (medians of interleaved repeats, inference under torch.inference_mode):
- dense: the same weights and binary gates, every token through every FFN (masked);
- sparse: gather/scatter FFN for the active tokens only, always;
- auto: what TokenSelectiveDepth runs in eval (sparse, or the dense fallback by its rule);
- speedup = dense / auto.

    python benchmarks/tsa.py                 # the full table (a few minutes on 2 threads)
    python benchmarks/tsa.py --quick         # batch 1 and 8 only, fewer repeats
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch

from models.build import build
from models.config import ModelConfig

SEQ, VOCAB = 256, 256


def make_model(tsa: bool) -> torch.nn.Module:
    cfg = ModelConfig(
        size="mini", vocab_size=VOCAB, block_size=SEQ, tsa={} if tsa else None, dropout=0.0
    )
    torch.manual_seed(0)
    return build(cfg)


@torch.no_grad()
def bias_routers_to(model: torch.nn.Module, alpha: float, batch: int = 8) -> float:
    """Set router biases so that `alpha` of the tokens stay active; returns the alpha
    measured on a fresh batch."""
    model.eval()
    calib = torch.randint(0, VOCAB, (batch, SEQ), generator=torch.Generator().manual_seed(1))
    for router in model.depth.routers:
        torch.nn.init.normal_(router.out.weight, std=1.0)
    for router in model.depth.routers:  # layer by layer: later routers see earlier gates
        seen = {}
        handle = router.out.register_forward_hook(
            lambda m, i, o, seen=seen: seen.update(z=(o - m.bias).flatten())  # -> None
        )
        model(calib)
        handle.remove()
        router.out.bias.fill_(-torch.quantile(seen["z"], alpha).item())
    test = torch.randint(0, VOCAB, (batch, SEQ), generator=torch.Generator().manual_seed(2))
    return model(test).metrics["tsa/alpha"].item()


def timed(fn, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


def inference_rows(alphas: list[float], batches: list[int], repeats: dict[int, int]) -> list:
    model = make_model(tsa=True)
    rows = []
    for target in alphas:
        alpha = bias_routers_to(model, target)
        for batch in batches:
            idx = torch.randint(0, VOCAB, (batch, SEQ))
            # From batch 64 on the rule always picks the sparse path (thousands of halted
            # tokens, alpha < 0.9), so 'sparse' would time the same thing as 'auto'.
            paths = [("dense", "dense"), ("auto", None)]
            if batch < 64:
                paths.insert(1, ("sparse", "sparse"))
            times: dict[str, list[float]] = {name: [] for name, _ in paths}

            def run(path: str | None, idx: torch.Tensor = idx) -> None:
                model.depth.force_path = path
                with torch.inference_mode():
                    model(idx)

            run(None)  # warm-up
            for _ in range(repeats[batch]):  # interleaved: load changes hit all paths alike
                for name, path in paths:
                    times[name] += timed(lambda p=path: run(p), 1)
            med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
            med.setdefault("sparse", med["auto"])
            rows.append((target, alpha, batch, med, med["dense"] / med["auto"]))
            print(
                f"alpha={alpha:.3f} batch={batch:4d}  dense {med['dense']:9.1f} ms  "
                f"sparse {med['sparse']:9.1f} ms  auto {med['auto']:9.1f} ms  "
                f"speedup {med['dense'] / med['auto']:.3f}x  (sparse-only "
                f"{med['dense'] / med['sparse']:.3f}x)",
                flush=True,
            )
    return rows


def training_overhead(batch: int, repeats: int) -> tuple[float, float]:
    """Median seconds of one forward+backward+AdamW step: dense GPT and soft TSA."""
    idx = torch.randint(0, VOCAB, (batch, SEQ))
    models = {name: make_model(tsa=name == "tsa").train() for name in ("dense", "tsa")}
    opts = {k: torch.optim.AdamW(m.parameters(), lr=1e-4) for k, m in models.items()}
    times: dict[str, list[float]] = {k: [] for k in models}

    def step(name: str) -> None:
        loss = models[name](idx, idx).loss
        opts[name].zero_grad()
        loss.backward()
        opts[name].step()

    for name in models:
        step(name)  # warm-up
    for _ in range(repeats):
        for name in models:
            times[name] += timed(lambda n=name: step(n), 1)
    return statistics.median(times["dense"]), statistics.median(times["tsa"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64, 128])
    parser.add_argument("--alphas", type=float, nargs="+", default=[0.73, 0.83])
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(
        f"torch {torch.__version__}, {platform.processor() or platform.machine()}, "
        f"{args.threads} threads; mini (6 layers, d=256), seq {SEQ}, vocab {VOCAB}"
    )
    batches = [1, 8] if args.quick else args.batches
    repeats = {b: 11 if b == 1 else 5 if b <= 8 else 3 for b in batches}
    rows = inference_rows(args.alphas, batches, repeats)
    print("\n| target α | measured α | batch | dense ms | sparse ms | auto ms | speedup |")
    print("|---|---|---|---|---|---|---|")
    for target, alpha, batch, med, speedup in rows:
        print(
            f"| {target:.2f} | {alpha:.3f} | {batch} | {med['dense']:.1f} | "
            f"{med['sparse']:.1f} | {med['auto']:.1f} | {speedup:.2f}× |"
        )
    dense, soft = training_overhead(batch=8, repeats=3)
    print(
        f"\ntraining step (batch 8 x {SEQ}, forward+backward+AdamW): dense {dense * 1e3:.0f} ms, "
        f"soft TSA {soft * 1e3:.0f} ms, overhead {100 * (soft / dense - 1):+.1f}%"
    )


if __name__ == "__main__":
    main()
