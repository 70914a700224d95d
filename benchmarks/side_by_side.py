"""scalelab's model beside the papers' own code, on the same batches, seed for seed.

Pairs, each at every --widths, for every --seeds:

  dense    scalelab's dense model with the TSA sweeps' layout (base.model of
           sweeps/tsa_cpu.yaml) against the TSA authors' dense baseline,
           `tsa.benchmarks.baseline_transformer.BaselineTransformer`.
  tsa      scalelab's TSA model (that layout and the sweep's router, soft gates) against
           the authors' `tsa.modules.topological_attention.variable_depth.TSATransformer`
           at the same --lambda-depth.
  nanogpt  scalelab's dense model with the layout of sweeps/hadamard_cpu.yaml (nanoGPT's)
           against nanoGPT's `model.py` (--nanogpt DIR: a checkout of karpathy/nanoGPT).

The TSA authors' code is imported from a checkout you give (--tsa-authors DIR: a clone of
github.com/AhmedHamadto/TSA; its src/ goes on the path). Nothing of it is copied into this
project. Without a checkout, `tsa` trains the authors' layout written from the paper's
equations (tests/models/test_authors_layout.py, `AuthorsTSA`) and says so on every line,
and `dense` is skipped. The authors' models return logits; their loss here is what their
language script computes (scripts/phase6_language.py, lines 278–282): cross-entropy plus `model.aux_loss()` (λ times
the mean soft active fraction) in training, cross-entropy alone in validation.

Both sides get the same optimiser (AdamW (0.9, 0.95), decay on Linear weights only — the
same parameters the authors' `configure_optimizers` decays —, clip 1.0, cosine to 0.1 lr
without warm-up), the same batches in the same order (random windows drawn from
(seed, step)), and each its own initial draw from the seed. TSA is evaluated with soft
gates on both sides (the authors' PyTorch model never binarises); α is the mean soft active
fraction 1 − p over routed token-layers, on the validation windows.

    python -m benchmarks.side_by_side --text plays.txt --pairs dense tsa --lambda-depth 0.05 \
        --tsa-authors ~/src/TSA --widths 64 128 --seeds 0 1 2 3 4 --out side.jsonl
    python -m benchmarks.side_by_side --table side.jsonl
    python -m benchmarks.side_by_side --check tsa --text plays.txt --tsa-authors ~/src/TSA
    python -m benchmarks.side_by_side --check nanogpt --text plays.txt --nanogpt ~/src/nanoGPT

One JSON line per (pair, width, seed, side): the training loss (and α) of every step, the
final validation loss and validation α. The table gives, per pair and width, each side's
mean ± sd over seeds, the mean paired gap (scalelab − reference) with its standard error,
whether it is within two standard errors of zero, and the training-loss gap along the way.
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
from pathlib import Path

import torch
import torch.nn.functional as F
import yaml
from torch import Tensor, nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.baseline_parity import Corpus, cosine  # noqa: E402

LAYOUT_KEYS = ("dropout_sites", "qkv_bias", "attn_out_bias", "ffn_bias", "bias_init",
               "init_distribution", "init_std", "bias")  # fmt: skip
EQUATIONS = "equations: tests/models/test_authors_layout.py AuthorsTSA"
AUTHORS = "TSA authors' code"


class Side(nn.Module):
    """One model under test: `step(x, y)` gives (loss, α or None) in the model's current
    mode (training: the loss that is minimised; eval: the task loss)."""

    def __init__(self, model: nn.Module, name: str) -> None:
        super().__init__()
        self.model, self.name = model, name

    def step(self, x: Tensor, y: Tensor) -> tuple[Tensor, float | None]:
        raise NotImplementedError


class ScalelabSide(Side):
    def step(self, x: Tensor, y: Tensor) -> tuple[Tensor, float | None]:
        out = self.model(x, y)
        alpha = out.metrics.get("tsa/alpha")
        return out.loss, None if alpha is None else float(alpha)


class AuthorsSide(Side):
    """The authors' model: logits out; their trainer adds `aux_loss()` in training."""

    def step(self, x: Tensor, y: Tensor) -> tuple[Tensor, float | None]:
        logits = self.model(x)
        loss = F.cross_entropy(logits.flatten(0, 1), y.reshape(-1))
        if self.model.training:
            loss = loss + self.model.aux_loss()
        alpha = getattr(self.model, "_last_mean_active_frac", None)
        return loss, alpha


class LossSide(Side):
    """A model whose forward(x, y) returns the loss (or a tuple ending with it)."""

    def __init__(self, model: nn.Module, name: str, lambda_depth: float = 0.0) -> None:
        super().__init__(model, name)
        self.lambda_depth = lambda_depth

    def step(self, x: Tensor, y: Tensor) -> tuple[Tensor, float | None]:
        if isinstance(self.model, _equations_class()):
            return self.model(x, y, self.lambda_depth if self.training else 0.0), None
        out = self.model(x, y.contiguous())  # nanoGPT's loss views y
        return (out[-1] if isinstance(out, tuple) else out), None


def sweep_layout(name: str) -> tuple[dict, dict]:
    """The layout keys of a reproduction sweep's base.model, and the settings of its first
    TSA entry (so the benchmark trains what the sweep trains)."""
    spec = yaml.safe_load((ROOT / "sweeps" / name).read_text())
    model = spec["base"]["model"]
    tsa = next((t for t in spec.get("zip", {}).get("model.tsa", []) if t), {})
    return {k: model[k] for k in LAYOUT_KEYS if k in model}, dict(tsa)


def scalelab_side(pair: str, a: argparse.Namespace, d: int) -> Side:
    from scalelab.models.build import build
    from scalelab.models.config import ModelConfig

    layout, tsa = sweep_layout("hadamard_cpu.yaml" if pair == "nanogpt" else "tsa_cpu.yaml")
    tsa = {**tsa, "lambda_depth": a.lambda_depth, "sparse_inference": False}
    cfg = ModelConfig(
        size="micro", n_layer=a.layers, d_model=d, n_head=a.heads, vocab_size=256,
        block_size=a.context, dropout=a.dropout, tsa=tsa if pair == "tsa" else None, **layout,
    )  # fmt: skip
    return ScalelabSide(build(cfg), "scalelab")


def reference_side(pair: str, a: argparse.Namespace, d: int) -> Side | None:
    """The external model, or None where its code was not given."""
    if pair == "nanogpt":
        module = _load_file("nanogpt_model", Path(a.nanogpt).expanduser() / "model.py")
        conf = module.GPTConfig(block_size=a.context, vocab_size=256, n_layer=a.layers,
                                n_head=a.heads, n_embd=d, dropout=a.dropout, bias=True)  # fmt: skip
        return LossSide(module.GPT(conf), f"nanoGPT model.py from {a.nanogpt}")
    if a.tsa_authors:
        src = str(Path(a.tsa_authors).expanduser() / "src")
        if src not in sys.path:
            sys.path.insert(0, src)
        name = f"{AUTHORS} ({a.tsa_authors})"
        if pair == "dense":
            base = importlib.import_module("tsa.benchmarks.baseline_transformer")
            model = base.BaselineTransformer(vocab_size=256, d_model=d, n_heads=a.heads,
                                             n_layers=a.layers, d_ff=4 * d,
                                             max_seq_len=a.context, dropout=a.dropout)  # fmt: skip
            return AuthorsSide(model, name)
        depth = importlib.import_module("tsa.modules.topological_attention.variable_depth")
        conf = depth.TSAConfig(vocab_size=256, d_model=d, n_heads=a.heads, n_layers=a.layers,
                               d_ff=4 * d, max_seq_len=a.context, dropout=a.dropout,
                               depth_reg_weight=a.lambda_depth)  # fmt: skip
        return AuthorsSide(depth.TSATransformer(conf), name)
    if pair == "dense":
        return None
    model = _equations_class()(256, a.context, d, a.layers, a.heads, a.dropout)
    return LossSide(model, EQUATIONS, a.lambda_depth)


def _equations_class() -> type:
    sys.path.insert(0, str(ROOT / "tests" / "models"))
    from test_authors_layout import AuthorsTSA

    return AuthorsTSA


def _load_file(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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


def optimiser(side: Side, a: argparse.Namespace) -> torch.optim.Optimizer:
    return torch.optim.AdamW(decay_groups(side, a.wd), lr=a.lr, betas=(0.9, 0.95), foreach=False)


def train(side: Side, seed: int, corpus: Corpus, a: argparse.Namespace) -> dict:
    opt = optimiser(side, a)
    side.train()
    losses, alphas, t0 = [], [], time.perf_counter()
    for step in range(a.steps):
        for group in opt.param_groups:
            group["lr"] = cosine(step, a.steps, a.lr)
        x, y = corpus.batch(seed, step, a.batch)
        loss, alpha = side.step(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(side.parameters(), 1.0)
        opt.step()
        losses.append(round(float(loss.detach()), 5))
        if alpha is not None:
            alphas.append(round(alpha, 5))
    val, val_alpha = evaluate(side, corpus.val_batches())
    out = {"train_loss": losses, "val_loss": val, "wall_s": round(time.perf_counter() - t0, 1)}
    if alphas:
        out |= {"train_alpha": alphas, "val_alpha": val_alpha}
    return out


@torch.no_grad()
def evaluate(side: Side, batches: list[tuple[Tensor, Tensor]]) -> tuple[float, float | None]:
    """Validation loss and soft α, each weighted by batch size."""
    side.eval()
    loss = alpha = 0.0
    n, has_alpha = 0, False
    for x, y in batches:
        batch_loss, batch_alpha = side.step(x, y)
        loss += float(batch_loss) * x.size(0)
        if batch_alpha is not None:
            alpha, has_alpha = alpha + batch_alpha * x.size(0), True
        n += x.size(0)
    side.train()
    return loss / n, (alpha / n if has_alpha else None)


def run(a: argparse.Namespace) -> None:
    torch.set_num_threads(a.threads)
    corpus = Corpus(Path(a.text), a.context)
    for pair in a.pairs:
        if pair == "nanogpt" and not a.nanogpt:
            print("nanogpt: skipped, no checkout given (--nanogpt DIR)", flush=True)
            continue
        if pair == "dense" and not a.tsa_authors:
            print("dense: skipped, no checkout of the TSA authors' code (--tsa-authors DIR)")
            continue
        for d in a.widths:
            for seed in a.seeds:
                for which in ("scalelab", "reference"):
                    torch.manual_seed(seed)
                    side = (
                        scalelab_side(pair, a, d)
                        if which == "scalelab"
                        else reference_side(pair, a, d)
                    )
                    out = {"pair": pair, "d": d, "seed": seed, "side": which, "model": side.name,
                           "steps": a.steps, "lr": a.lr, "layers": a.layers, "heads": a.heads,
                           "dropout": a.dropout, "lambda_depth": a.lambda_depth if pair == "tsa" else None,
                           **train(side, seed, corpus, a)}  # fmt: skip
                    print(json.dumps({k: v for k, v in out.items() if not k.startswith("train_")}),
                          flush=True)  # fmt: skip
                    with open(a.out, "a") as f:
                        f.write(json.dumps(out) + "\n")


# Each reference's parameter names: (its prefix of the embeddings and final norm, of block i,
# its block's modules -> scalelab's, whether it has TSA's routers). The TSA authors' head is
# tied to token_emb, nanoGPT's to wte.
NAMES = {
    "authors": ("", "blocks.{i}", (("ln1", "ln_1"), ("ln2", "ln_2"), ("attn.qkv", "attn.c_attn"),
                ("attn.proj", "attn.out_proj"), ("ffn.net.0", "mlp.c_fc"),
                ("ffn.net.3", "mlp.c_proj")), ("token_emb", "pos_emb")),
    "nanogpt": ("transformer.", "transformer.h.{i}", (("ln_1", "ln_1"), ("ln_2", "ln_2"),
                ("attn.c_attn", "attn.c_attn"), ("attn.c_proj", "attn.out_proj"),
                ("mlp.c_fc", "mlp.c_fc"), ("mlp.c_proj", "mlp.c_proj")), ("wte", "wpe")),
}  # fmt: skip


def reference_names(pair: str, n_layer: int) -> dict[str, str]:
    """The reference model's parameter names -> scalelab's."""
    top, block, modules, (tok, pos) = NAMES["nanogpt" if pair == "nanogpt" else "authors"]
    names = {f"{top}{tok}.weight": "wte.weight", f"{top}{pos}.weight": "wpe.weight"}
    for part in ("weight", "bias"):
        names[f"{top}ln_f.{part}"] = f"ln_f.{part}"
        for i in range(n_layer):
            for theirs, mine in modules:
                names[f"{block.format(i=i)}.{theirs}.{part}"] = f"blocks.{i}.{mine}.{part}"
        for j in range(n_layer - 1):  # TSA's routers (absent from a dense reference)
            names[f"routers.{j}.mlp.0.{part}"] = f"depth.routers.{j}.fc.{part}"
            names[f"routers.{j}.mlp.2.{part}"] = f"depth.routers.{j}.out.{part}"
    return names


def check(pair: str, a: argparse.Namespace) -> tuple[float, float]:
    """The reference model and scalelab's given the same initial weights (the reference's,
    for the TSA authors' models; scalelab's for nanoGPT, whose init is not the point), the
    same batches and the random state before each forward (so the same dropout masks where
    dropout sits in the same places) for --check-steps AdamW steps: the largest loss gap and
    the largest α gap (0 for a dense pair)."""
    corpus = Corpus(Path(a.text), a.context)
    d = a.widths[0]
    torch.manual_seed(0)
    ours = scalelab_side(pair, a, d)
    ref = reference_side(pair, a, d)
    if ref is None:
        raise SystemExit(f"--check {pair} needs --tsa-authors DIR")
    theirs_to_mine = reference_names(pair, a.layers)
    mine = dict(ours.model.named_parameters())
    theirs = dict(ref.model.named_parameters())
    if pair == "nanogpt":  # nanoGPT takes scalelab's weights
        pull, dst = {t: mine[m] for t, m in theirs_to_mine.items() if t in theirs}, ref.model
    else:  # scalelab takes the authors'
        pull, dst = {m: theirs[t] for t, m in theirs_to_mine.items() if t in theirs}, ours.model
    with torch.no_grad():
        for name, param in dst.named_parameters():
            param.copy_(pull[name])
    opts = [optimiser(side, a) for side in (ours, ref)]
    worst_loss = worst_alpha = 0.0
    for step in range(a.check_steps):
        x, y = corpus.batch(0, step, a.batch)
        results = []
        for side, opt in zip((ours, ref), opts, strict=True):
            side.train()
            torch.manual_seed(1000 + step)
            loss, alpha = side.step(x, y)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(side.parameters(), 1.0)
            opt.step()
            results.append((loss.item(), alpha or 0.0))
        (l0, a0), (l1, a1) = results
        worst_loss, worst_alpha = max(worst_loss, abs(l0 - l1)), max(worst_alpha, abs(a0 - a1))
    return worst_loss, worst_alpha


def _mean_sd(values: list[float]) -> str:
    sd = statistics.stdev(values) if len(values) > 1 else float("nan")
    return f"{statistics.fmean(values):.4f} ± {sd:.4f}"


def _gap(values: list[float]) -> tuple[str, str]:
    """The mean paired gap ± its standard error, and whether it is within two of them."""
    mean = statistics.fmean(values)
    se = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else float("nan")
    within = "yes" if abs(mean) <= 2 * se else "no"
    return f"{mean:+.4f} ± {se:.4f}", within


def table(paths: list[Path]) -> None:
    rows = [json.loads(line) for p in paths for line in p.read_text().splitlines() if line]
    by: dict[tuple, dict] = defaultdict(dict)
    names: dict[tuple, set] = defaultdict(set)
    for r in rows:
        by[(r["pair"], r["d"], r["side"])][r["seed"]] = r
        names[(r["pair"], r["d"])].add(r["model"])
    print("| pair | d | seeds | scalelab val loss | reference val loss | gap (± s.e.) | within 2 s.e. "
          "| train gap by step | scalelab α | reference α | α gap (± s.e.) | within 2 s.e. |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    references = []
    for pair, d in sorted({(p, w) for p, w, _ in by}):
        ours, ref = by[(pair, d, "scalelab")], by[(pair, d, "reference")]
        seeds = sorted(set(ours) & set(ref))
        if not seeds:
            continue
        gap, within = _gap([ours[s]["val_loss"] - ref[s]["val_loss"] for s in seeds])
        steps = len(ours[seeds[0]]["train_loss"])
        marks = sorted({min(steps, k) for k in (100, steps // 2, steps)})
        along = ", ".join(f"{k}: {_train_gap(ours, ref, seeds, k):+.3f}" for k in marks)
        alpha = ["–"] * 4
        if (
            ours[seeds[0]].get("val_alpha") is not None
            and ref[seeds[0]].get("val_alpha") is not None
        ):
            a_gap, a_within = _gap([ours[s]["val_alpha"] - ref[s]["val_alpha"] for s in seeds])
            alpha = [_mean_sd([ours[s]["val_alpha"] for s in seeds]),
                     _mean_sd([ref[s]["val_alpha"] for s in seeds]), a_gap, a_within]  # fmt: skip
        lam = ours[seeds[0]].get("lambda_depth")
        label = f"{pair} (λ {lam:g})" if lam is not None else pair
        print(f"| {label} | {d} | {len(seeds)} | {_mean_sd([ours[s]['val_loss'] for s in seeds])} | "
              f"{_mean_sd([ref[s]['val_loss'] for s in seeds])} | {gap} | {within} | {along} | "
              + " | ".join(alpha) + " |")  # fmt: skip
        references += sorted(names[(pair, d)] - {"scalelab"})
    for name in dict.fromkeys(references):
        print(f"\nreference: {name}")


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
    ap.add_argument("--text", type=Path, help="byte-level training text (held-out tail: last 10%%)")
    ap.add_argument("--pairs", nargs="+", choices=["dense", "tsa", "nanogpt"], default=["tsa"])
    ap.add_argument("--tsa-authors", help="a checkout of github.com/AhmedHamadto/TSA")
    ap.add_argument("--nanogpt", help="a checkout of karpathy/nanoGPT (its model.py)")
    ap.add_argument("--widths", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--dropout", type=float, default=0.1)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--wd", type=float, default=0.1)
    ap.add_argument("--lambda-depth", type=float, default=0.05)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=Path("side_by_side.jsonl"))
    ap.add_argument("--check", choices=["dense", "tsa", "nanogpt"],
                    help="one pair given the same initial weights and dropout masks: the largest "
                    "loss and α gaps over --check-steps steps (at the first --widths)")  # fmt: skip
    ap.add_argument("--check-steps", type=int, default=30)
    a = ap.parse_args()
    if a.table:
        table(a.table)
    elif a.text is None:
        ap.error("--text is required to train or --check (or --table to print results)")
    elif a.check:
        torch.set_num_threads(a.threads)
        loss_gap, alpha_gap = check(a.check, a)
        ref = reference_side(a.check, a, a.widths[0])
        lam = f", λ {a.lambda_depth:g}" if a.check == "tsa" else ""
        print(f"{ref.name} vs scalelab ({a.check}, d {a.widths[0]}, dropout {a.dropout}{lam}): "
              f"largest |loss gap| over {a.check_steps} steps {loss_gap:.2e}, "
              f"largest |α gap| {alpha_gap:.2e}")  # fmt: skip
    else:
        run(a)


if __name__ == "__main__":
    main()
