"""TSA: sparse against dense inference time, and soft-gating training overhead.

Models: 6 layers, 8 heads, d_model 512 (the paper's few-million-parameter regime, where the
FFN is ~60% of a block's CPU time) and d_model 256 (the 'mini' preset); vocabulary 256
(character LM), sequence 256, fp32. The routers are biased to reach a target active
fraction alpha: each router's last layer gets N(0, 1) weights and a bias set, layer by layer
on a calibration batch, to the quantile that leaves `alpha` of the tokens active (p <= 0.5).
The backbone weights are the initial ones; the time of a forward pass does not depend on
their values.

Columns (medians of interleaved round-robin repeats, under torch.inference_mode):
- dense: the same weights and binary gates, every token through every FFN (masked);
- sparse: gather/scatter FFN for the active tokens only, always;
- auto: what TokenSelectiveDepth runs in eval (sparse, or the dense fallback by its rule);
- speedup = dense / auto, on wall time and on process CPU time (the machine is shared: CPU
  time is the steadier figure with 1 thread; with 2 it includes OpenMP spin-waits).

    python benchmarks/tsa.py                        # d 512 and 256, threads 2 then 1
    python benchmarks/tsa.py --d-models 512 --threads 2 --batches 64
    python benchmarks/tsa.py --quick                # batch 1 and 8 only, fewer repeats
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import torch

from scalelab.models.build import build
from scalelab.models.config import ModelConfig

SEQ, VOCAB = 256, 256


def make_model(tsa: bool, d_model: int = 512) -> torch.nn.Module:
    cfg = ModelConfig(
        size="mini", d_model=d_model, vocab_size=VOCAB, block_size=SEQ,
        tsa={} if tsa else None, dropout=0.0,
    )  # fmt: skip
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


def timed(fn, repeats: int) -> list[tuple[float, float]]:
    """(wall, process CPU) seconds of each call."""
    out = []
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        fn()
        out.append((time.perf_counter() - wall, time.process_time() - cpu))
    return out


def medians(samples: list[tuple[float, float]]) -> tuple[float, float]:
    return tuple(statistics.median(s[i] for s in samples) * 1e3 for i in (0, 1))


def inference_rows(
    d_model: int, alphas: list[float], batches: list[int], repeats: dict[int, int]
) -> list:
    model = make_model(tsa=True, d_model=d_model)
    rows = []
    for target in alphas:
        alpha = bias_routers_to(model, target)
        for batch in batches:
            idx = torch.randint(0, VOCAB, (batch, SEQ))
            # From batch 8 on the rule picks the sparse path at these alphas (hundreds of
            # skipped tokens per block), so 'sparse' would time the same thing as 'auto'.
            paths = [("dense", "dense"), ("auto", None)]
            if batch < 8:
                paths.insert(1, ("sparse", "sparse"))
            times: dict[str, list] = {name: [] for name, _ in paths}

            def run(path: str | None, idx: torch.Tensor = idx) -> None:
                model.depth.force_path = path
                with torch.inference_mode():
                    model(idx)

            for _, path in paths:  # warm-up
                run(path)
            for _ in range(repeats[batch]):  # round-robin: load changes hit all paths alike
                for name, path in paths:
                    times[name] += timed(lambda p=path: run(p), 1)
            med = {k: medians(v) for k, v in times.items()}
            med.setdefault("sparse", med["auto"])
            wall = med["dense"][0] / med["auto"][0]
            cpu = med["dense"][1] / med["auto"][1]
            rows.append((d_model, target, alpha, batch, med, wall, cpu))
            print(
                f"d={d_model} alpha={alpha:.3f} batch={batch:4d}  dense {med['dense'][0]:8.1f} "
                f"sparse {med['sparse'][0]:8.1f} auto {med['auto'][0]:8.1f} ms  "
                f"speedup wall {wall:.3f}x cpu {cpu:.3f}x (load {os.getloadavg()[0]:.1f})",
                flush=True,
            )
    return rows


def training_overhead(d_model: int, batch: int, repeats: int) -> dict[str, tuple[float, float]]:
    """Median (wall, CPU) ms of one forward+backward+AdamW step: dense GPT and soft TSA."""
    idx = torch.randint(0, VOCAB, (batch, SEQ))
    models = {n: make_model(tsa=n == "tsa", d_model=d_model).train() for n in ("dense", "tsa")}
    opts = {k: torch.optim.AdamW(m.parameters(), lr=1e-4) for k, m in models.items()}
    times: dict[str, list] = {k: [] for k in models}

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
    return {k: medians(v) for k, v in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, nargs="+", default=[2, 1])
    parser.add_argument("--d-models", type=int, nargs="+", default=[512, 256])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64, 128])
    parser.add_argument("--alphas", type=float, nargs="+", default=[0.73, 0.83])
    parser.add_argument("--train-repeats", type=int, default=5, help="0: skip training")
    args = parser.parse_args()
    batches = [1, 8] if args.quick else args.batches
    repeats = {b: 11 if b == 1 else 5 if b <= 8 else 3 for b in batches}
    print(
        f"torch {torch.__version__}, {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}; 6 layers, 8 heads, "
        f"seq {SEQ}, vocab {VOCAB}"
    )
    rows, training = [], []
    for threads in args.threads:
        torch.set_num_threads(threads)
        for d_model in args.d_models:
            for row in inference_rows(d_model, args.alphas, batches, repeats):
                rows.append((threads, *row))
            if args.train_repeats:
                training.append(
                    (threads, d_model, training_overhead(d_model, 8, args.train_repeats))
                )
    print(
        "\n| threads | d | target α | measured α | batch | dense ms | sparse ms | auto ms "
        "| speedup (wall) | dense CPU ms | auto CPU ms | speedup (CPU) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for threads, d_model, target, alpha, batch, med, wall, cpu in rows:
        print(
            f"| {threads} | {d_model} | {target:.2f} | {alpha:.3f} | {batch} | "
            f"{med['dense'][0]:.1f} | {med['sparse'][0]:.1f} | {med['auto'][0]:.1f} | "
            f"{wall:.2f}× | {med['dense'][1]:.1f} | {med['auto'][1]:.1f} | {cpu:.2f}× |"
        )
    if training:
        print(
            f"\ntraining step (batch 8 x {SEQ}, forward+backward+AdamW), medians\n"
            "| threads | d | dense ms | soft TSA ms | overhead (wall) | overhead (CPU) |\n"
            "|---|---|---|---|---|---|"
        )
        for threads, d_model, t in training:
            print(
                f"| {threads} | {d_model} | {t['dense'][0]:.0f} | {t['tsa'][0]:.0f} | "
                f"{100 * (t['tsa'][0] / t['dense'][0] - 1):+.1f}% | "
                f"{100 * (t['tsa'][1] / t['dense'][1] - 1):+.1f}% |"
            )


if __name__ == "__main__":
    main()
