"""Where the best learning rate sits at three widths, with and without µP (issue 19).

scalelab's dense GPT (2 layers, 4 heads, context 64, batch 16, dropout 0, --steps steps of
AdamW with cosine decay to 0.1 lr, no warm-up) on the Shakespeare plays of
benchmarks/baseline_parity.py, at three widths (d_model 32 / 64 / 128 by default) and a
learning-rate grid, under model.parametrization 'standard' and 'mup' (base width: the
smallest, where the two are the same model, so that run is not repeated). Every run reads
the same batches. Final validation loss per run goes to --out (a rerun skips what is
there); `plot` draws loss against learning rate, one line per width, one panel per
parametrisation, the best learning rate of each width marked.

    python benchmarks/mup_lr_sweep.py run --text plays.txt --out mup_sweep.jsonl
    python benchmarks/mup_lr_sweep.py plot mup_sweep.jsonl docs/reproducing/mup_lr_transfer.png
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import torch

from benchmarks.baseline_parity import Corpus, train_arm

WIDTHS = (32, 64, 128)
LRS = (1e-3, 3e-3, 1e-2, 3e-2)
STANDARD, MUP = "scalelab", "scalelab:parametrization=mup"


def run(args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    corpus = Corpus(args.text, context=64)
    base = min(args.widths)
    rows = (
        [json.loads(line) for line in args.out.read_text().splitlines()]
        if args.out.exists()
        else []
    )
    results = {(r["arm"], r["d"], r["lr"]): r for r in rows if r["mup_base"] == base}
    for lr in args.lrs:
        for d in args.widths:
            for arm in (STANDARD, MUP):
                if (arm, d, lr) in results:
                    continue
                if arm == MUP and d == base:  # µP at its base width is the standard model
                    result = {**results[(STANDARD, d, lr)], "arm": MUP, "same_run_as": STANDARD}
                else:
                    setup = argparse.Namespace(
                        context=64, d=d, layers=2, heads=4, dropout=0.0, tsa=False, lr=lr,
                        wd=0.1, mup_base=base, steps=args.steps, batch=16, clip=1.0,
                    )  # fmt: skip
                    result = {**train_arm(arm, args.seed, corpus, setup), "mup_base": base}
                results[(arm, d, lr)] = result
                print(json.dumps(result), flush=True)
                with args.out.open("a") as f:
                    f.write(json.dumps(result) + "\n")


def plot(results: Path, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [json.loads(line) for line in results.read_text().splitlines() if line]
    curves: dict[tuple[str, int], dict[float, float]] = defaultdict(dict)
    for r in rows:
        curves[(r["arm"], r["d"])][r["lr"]] = r["val_loss"]
    fig, axes = plt.subplots(1, 2, figsize=(8, 3.2), sharey=True, dpi=90)
    base = min(r["mup_base"] for r in rows)
    titles = {STANDARD: "standard", MUP: f"µP (base width {base})"}
    for ax, arm in zip(axes, titles, strict=True):
        for d in sorted({d for a, d in curves if a == arm}):
            points = sorted(curves[(arm, d)].items())
            lrs, losses = zip(*points, strict=True)
            (line,) = ax.plot(lrs, losses, marker="o", ms=3, label=f"d {d}")
            best = min(points, key=lambda p: p[1])
            ax.plot(*best, marker="*", ms=12, color=line.get_color())
        ax.set_xscale("log")
        ax.set_title(titles[arm])
        ax.set_xlabel("learning rate")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("validation loss (nats/byte)")
    axes[1].legend()
    low = min(v for c in curves.values() for v in c.values())
    axes[0].set_ylim(low - 0.05, low + 0.8)
    fig.tight_layout()
    fig.savefig(out)
    print(f"wrote {out}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--text", type=Path, required=True)
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--widths", type=int, nargs="+", default=list(WIDTHS))
    r.add_argument("--lrs", type=float, nargs="+", default=list(LRS))
    r.add_argument("--steps", type=int, default=200)
    r.add_argument("--seed", type=int, default=0)
    p = sub.add_parser("plot")
    p.add_argument("results", type=Path)
    p.add_argument("out", type=Path)
    args = ap.parse_args()
    run(args) if args.cmd == "run" else plot(args.results, args.out)


if __name__ == "__main__":
    main()
