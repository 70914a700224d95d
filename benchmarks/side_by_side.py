"""scalelab's model beside the papers' own implementations, on the same batches (issue 31).

Two pairs, each at every --widths, for every --seeds:

  tsa      scalelab's TSA model with the layout of sweeps/tsa_cpu.yaml (its base.model layout
           keys and its TSA router) against the TSA authors' model, from a checkout you point
           to (--tsa-checkout DIR --tsa-factory MODULE:CALLABLE; nothing of it is copied into
           this project). Without a checkout the reference is the authors' layout written
           from the paper's equations in tests/models/test_authors_layout.py (`AuthorsTSA`),
           and every line printed says so.
  nanogpt  scalelab's dense model with the layout of sweeps/hadamard_cpu.yaml (nanoGPT's)
           against nanoGPT's `model.py` from a checkout (--nanogpt DIR: karpathy/nanoGPT).
           Skipped, saying so, without one.

The TSA factory is called as factory(vocab_size=, block_size=, d_model=, n_layer=, n_head=,
dropout=, lambda_depth=) and must return an nn.Module whose forward(idx, targets) returns
the loss, or a tuple whose last element is it (as nanoGPT's (logits, loss)). Validation
calls it in eval mode. Both sides get the same optimiser (AdamW (0.9, 0.95), decay on Linear
weights only, clip 1.0, cosine to 0.1 lr without warm-up), the same batches in the same
order (random windows drawn from (seed, step)), and each its own initial draw from the seed.
scalelab evaluates TSA with soft gates (as in training), like the reference.

The setting of issue 31 (docs/reproducing/baseline.md, "Side by side"): byte-level text,
6 layers, 4 heads, context 128, batch 16, dropout 0.1, 600 steps, widths 64 and 128, 3 seeds:

    python benchmarks/side_by_side.py --text plays.txt --pairs tsa nanogpt \
        --nanogpt ~/src/nanoGPT --widths 64 128 --seeds 0 1 2 --out side.jsonl
    python benchmarks/side_by_side.py --table side.jsonl
    python benchmarks/side_by_side.py --check --text plays.txt --nanogpt ~/src/nanoGPT --widths 64

One JSON line per (pair, width, seed, side): the training loss of every step and the final
validation loss (256 fixed windows of the held-out tail). The table gives, per pair and
width, each side's mean validation loss, the mean paired gap (scalelab - reference) with its
standard error over seeds, and the training-loss gap (mean of 50 steps) along the way.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import math
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import torch
import yaml
from torch import Tensor, nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.baseline_parity import Corpus, cosine, val_loss  # noqa: E402

LAYOUT_KEYS = ("dropout_sites", "qkv_bias", "attn_out_bias", "ffn_bias", "bias_init",
               "init_distribution", "init_std", "bias")  # fmt: skip
EQUATIONS = "equations: tests/models/test_authors_layout.py AuthorsTSA"


def sweep_layout(name: str) -> tuple[dict, dict]:
    """The layout keys of a reproduction sweep's base.model, and the settings of its first
    TSA entry (so the benchmark trains what the sweep trains)."""
    spec = yaml.safe_load((ROOT / "sweeps" / name).read_text())
    model = spec["base"]["model"]
    tsa = next((t for t in spec.get("zip", {}).get("model.tsa", []) if t), {})
    return {k: model[k] for k in LAYOUT_KEYS if k in model}, dict(tsa)


def scalelab_side(pair: str, a: argparse.Namespace, d: int) -> nn.Module:
    from scalelab.models.build import build
    from scalelab.models.config import ModelConfig

    layout, tsa = sweep_layout("tsa_cpu.yaml" if pair == "tsa" else "hadamard_cpu.yaml")
    if pair == "tsa":
        tsa = {**tsa, "lambda_depth": a.lambda_depth, "sparse_inference": False}
    cfg = ModelConfig(
        size="micro", n_layer=a.layers, d_model=d, n_head=a.heads, vocab_size=256,
        block_size=a.context, dropout=a.dropout, tsa=tsa if pair == "tsa" else None, **layout,
    )  # fmt: skip
    model = build(cfg)
    model.loss_of = lambda x, y: model(x, y).loss
    return model


def reference_side(pair: str, a: argparse.Namespace, d: int) -> tuple[nn.Module, str]:
    """The external model and a line naming which one it is."""
    shape = dict(vocab_size=256, block_size=a.context, d_model=d, n_layer=a.layers,
                 n_head=a.heads, dropout=a.dropout)  # fmt: skip
    if pair == "nanogpt":
        module = _load_file("nanogpt_model", Path(a.nanogpt).expanduser() / "model.py")
        conf = module.GPTConfig(block_size=a.context, vocab_size=256, n_layer=a.layers,
                                n_head=a.heads, n_embd=d, dropout=a.dropout, bias=True)  # fmt: skip
        model = module.GPT(conf)
        model.loss_of = lambda x, y: _loss(model(x, y.contiguous()))  # its loss views y
        return model, f"nanoGPT model.py from {a.nanogpt}"
    if a.tsa_checkout:
        sys.path.insert(0, str(Path(a.tsa_checkout).expanduser()))
        mod, _, attr = a.tsa_factory.partition(":")
        model = getattr(importlib.import_module(mod), attr)(**shape, lambda_depth=a.lambda_depth)
        model.loss_of = lambda x, y: _loss(model(x, y))
        return model, f"TSA authors' code: {a.tsa_factory} from {a.tsa_checkout}"
    sys.path.insert(0, str(ROOT / "tests" / "models"))
    from test_authors_layout import AuthorsTSA

    model = AuthorsTSA(256, a.context, d, a.layers, a.heads, a.dropout)
    model.loss_of = lambda x, y: model(x, y, a.lambda_depth if model.training else 0.0)
    return model, EQUATIONS


def _load_file(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _loss(out: Tensor | tuple) -> Tensor:
    return out[-1] if isinstance(out, tuple) else out


def decay_groups(model: nn.Module, wd: float) -> list[dict]:
    """scalelab's rule for any model: decay on Linear weights that are not an embedding's."""
    embedding = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    linear = {id(m.weight) for m in model.modules() if isinstance(m, nn.Linear)}
    decay, rest, seen = [], [], set()
    for p in model.parameters():
        if id(p) in seen or not p.requires_grad:
            continue
        seen.add(id(p))
        (decay if id(p) in linear - embedding else rest).append(p)
    return [{"params": decay, "weight_decay": wd}, {"params": rest, "weight_decay": 0.0}]


def train(model: nn.Module, loss_of: Callable, seed: int, corpus: Corpus, a) -> dict:
    opt = torch.optim.AdamW(decay_groups(model, a.wd), lr=a.lr, betas=(0.9, 0.95), foreach=False)
    model.train()
    losses, t0 = [], time.perf_counter()
    for step in range(a.steps):
        for group in opt.param_groups:
            group["lr"] = cosine(step, a.steps, a.lr)
        x, y = corpus.batch(seed, step, a.batch)
        loss = loss_of(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(round(float(loss.detach()), 5))
    val = val_loss(loss_of, model, corpus.val_batches())
    return {"train_loss": losses, "val_loss": val, "wall_s": round(time.perf_counter() - t0, 1)}


def run(a: argparse.Namespace) -> None:
    torch.set_num_threads(a.threads)
    corpus = Corpus(Path(a.text), a.context)
    for pair in a.pairs:
        if pair == "nanogpt" and not a.nanogpt:
            print("nanogpt: skipped, no checkout given (--nanogpt DIR)", flush=True)
            continue
        for d in a.widths:
            for seed in a.seeds:
                for side in ("scalelab", "reference"):
                    torch.manual_seed(seed)
                    if side == "scalelab":
                        model, which = scalelab_side(pair, a, d), "scalelab"
                    else:
                        model, which = reference_side(pair, a, d)
                    out = {"pair": pair, "d": d, "seed": seed, "side": side, "model": which,
                           "steps": a.steps, "lr": a.lr, "layers": a.layers, "heads": a.heads,
                           **train(model, model.loss_of, seed, corpus, a)}  # fmt: skip
                    print(json.dumps({k: v for k, v in out.items() if k != "train_loss"}),
                          flush=True)  # fmt: skip
                    with open(a.out, "a") as f:
                        f.write(json.dumps(out) + "\n")


def check_nanogpt(a: argparse.Namespace, steps: int = 20) -> float:
    """nanoGPT's model given scalelab's initial weights computes what scalelab's model with
    the Hadamard sweeps' layout computes: the same batches and random state before each
    forward (so the same dropout masks) for `steps` AdamW steps; the largest loss gap."""
    corpus = Corpus(Path(a.text), a.context)
    torch.manual_seed(0)
    ours, d = scalelab_side("nanogpt", a, a.widths[0]), a.widths[0]
    ref, _ = reference_side("nanogpt", a, d)
    names = {"transformer.wte.weight": "wte.weight", "transformer.wpe.weight": "wpe.weight"}
    for part in ("weight", "bias"):
        names[f"transformer.ln_f.{part}"] = f"ln_f.{part}"
        for i in range(a.layers):
            for theirs, mine in (("ln_1", "ln_1"), ("ln_2", "ln_2"), ("attn.c_attn", "attn.c_attn"),
                                 ("attn.c_proj", "attn.out_proj"), ("mlp.c_fc", "mlp.c_fc"),
                                 ("mlp.c_proj", "mlp.c_proj")):  # fmt: skip
                names[f"transformer.h.{i}.{theirs}.{part}"] = f"blocks.{i}.{mine}.{part}"
    src = dict(ours.named_parameters())
    with torch.no_grad():
        for name, param in ref.named_parameters():
            param.copy_(src[names[name]])
    opts = [torch.optim.AdamW(decay_groups(m, a.wd), lr=a.lr, betas=(0.9, 0.95), foreach=False)
            for m in (ours, ref)]  # fmt: skip
    worst = 0.0
    for step in range(steps):
        x, y = corpus.batch(0, step, a.batch)
        losses = []
        for model, opt in zip((ours, ref), opts, strict=True):
            model.train()
            torch.manual_seed(1000 + step)
            loss = model.loss_of(x, y)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            losses.append(loss.item())
        worst = max(worst, abs(losses[0] - losses[1]))
    return worst


def table(paths: list[Path]) -> None:
    rows = [json.loads(line) for p in paths for line in p.read_text().splitlines() if line]
    by: dict[tuple, dict] = defaultdict(dict)
    names: dict[tuple, set] = defaultdict(set)
    for r in rows:
        by[(r["pair"], r["d"], r["side"])][r["seed"]] = r
        names[(r["pair"], r["d"])].add(r["model"])
    print("| pair | d | reference | seeds | scalelab val | reference val | gap (± s.e.) "
          "| train gap by step |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for pair, d in sorted({(p, w) for p, w, _ in by}):
        ours, ref = by[(pair, d, "scalelab")], by[(pair, d, "reference")]
        seeds = sorted(set(ours) & set(ref))
        if not seeds:
            continue
        gaps = [ours[s]["val_loss"] - ref[s]["val_loss"] for s in seeds]
        se = statistics.stdev(gaps) / math.sqrt(len(gaps)) if len(gaps) > 1 else float("nan")
        steps = len(ours[seeds[0]]["train_loss"])
        marks = sorted({min(steps, k) for k in (100, steps // 2, steps)})
        along = ", ".join(f"{k}: {_train_gap(ours, ref, seeds, k):+.3f}" for k in marks)
        reference = "; ".join(sorted(names[(pair, d)] - {"scalelab"}))
        print(f"| {pair} | {d} | {reference} | {len(seeds)} | "
              f"{statistics.fmean(ours[s]['val_loss'] for s in seeds):.4f} | "
              f"{statistics.fmean(ref[s]['val_loss'] for s in seeds):.4f} | "
              f"{statistics.fmean(gaps):+.4f} ± {se:.4f} | {along} |")  # fmt: skip


def _train_gap(ours: dict, ref: dict, seeds: list[int], step: int) -> float:
    """Mean over seeds of the paired training-loss gap, averaged over the 50 steps to `step`."""
    lo = max(0, step - 50)
    return statistics.fmean(
        statistics.fmean(ours[s]["train_loss"][lo:step]) - statistics.fmean(ref[s]["train_loss"][lo:step])
        for s in seeds
    )  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--table", type=Path, nargs="+", help="print the table of these results")
    ap.add_argument("--text", type=Path, help="byte-level training text (held-out tail: last 10%)")
    ap.add_argument("--pairs", nargs="+", choices=["tsa", "nanogpt"], default=["tsa"])
    ap.add_argument("--tsa-checkout", help="a checkout of the TSA authors' code")
    ap.add_argument("--tsa-factory", default="model:build", help="MODULE:CALLABLE in it")
    ap.add_argument("--nanogpt", help="a checkout of karpathy/nanoGPT (its model.py)")
    ap.add_argument("--widths", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--dropout", type=float, default=0.1)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--wd", type=float, default=0.1)
    ap.add_argument("--lambda-depth", type=float, default=0.0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=Path("side_by_side.jsonl"))
    ap.add_argument("--check", action="store_true",
                    help="nanoGPT given scalelab's weights: largest loss gap over 20 steps")  # fmt: skip
    a = ap.parse_args()
    if a.table:
        table(a.table)
    elif a.check and a.text and a.nanogpt:
        gap = check_nanogpt(a)
        print(f"nanoGPT model.py ({a.nanogpt}) with scalelab's initial weights vs scalelab with "
              f"the Hadamard sweeps' layout, d {a.widths[0]}, dropout {a.dropout}: largest "
              f"|loss gap| over 20 steps {gap:.2e}")  # fmt: skip
    elif a.text is None:
        ap.error("--text is required to train (or --table to print results)")
    else:
        run(a)


if __name__ == "__main__":
    main()
