"""TSA and BudgetFormer inference: cached decoding (models/decode.py) against the masked
full forward, and its speed against dense of the same size.

Each model is benchmarks/inference.py's case at its stated operating point (TSA's routers
biased so that alpha = 0.726 of the routed token-layers run, so tokens do halt; BudgetFormer
at its initial budget, k = H/2 heads per token). Match: in fp32 (TF32 off), a prompt is
prefilled and the rest decoded one token at a time (halted tokens skip their FFN and
attention, unselected heads are not computed); every position's logits must equal those of
one full forward in eval mode (the masked computation: every token and head computed, the
gates applied) within MATCH_TOL x max |logits|. Then the model in the run's dtype (bf16 on
a GPU) decodes the same way: its logits must be finite, its decode tokens/s is reported.

Speed: dense, TSA and BudgetFormer of one size, built afresh in the speed dtype (bf16 on a
GPU), each timed on a prefill (one cached forward over batch x prompt tokens, the last
position read out) and a decode (`new` one-token steps after that prompt, one synchronize
at the end) at batch 1 and 16, the variants alternated (benchmarks/timing.py), medians.
Each row's speed-up is dense's time / the variant's (> 1: the variant is faster). The
papers' wall-clock claims, for the goals: TSA reports 1.023x at alpha = 0.726 (sparse
inference, Tiny-Shakespeare, an Apple M1 Pro) and speed-ups only from batch 64 up, where
they outweigh the CPU-GPU synchronisation of its routing; BudgetFormer reports FLOPs and
memory falling with the budget s, no wall-clock time. So every row's goal is a speed-up
> 1.0. On the CPU the same code runs at nano: its ratio is reported, the row skipped.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from benchmarks.acceptance.checks import NO_GPU, Check, verdict
from benchmarks.inference import build_case, executed_fraction
from benchmarks.timing import interleaved_times
from scalelab.models.decode import KVCache, forward_cached

VARIANTS = ("tsa", "budget")
MATCH_TOL = 1e-4  # of max |logits|: fp32 rounding of two orders of summation, no more
TSA_ALPHA = 0.726  # the TSA paper's matched operating point
# dense time / variant time. Neither paper claims a wall-clock gain at batches 1 and 16
# (PAPER_CLAIM), so the goal is that the mechanism costs dense no more than 10% there; the
# measured speed-up is the answer.
SPEEDUP_GOAL = 0.9
PHASES = ("prefill", "decode")
PAPER_CLAIM = {
    "tsa": "the TSA paper: 1.023x at alpha 0.726 (batches >= 64, an Apple M1 Pro), no "
    "speed-up at smaller batches (its routing's CPU-GPU synchronisation)",
    "budget": "the BudgetFormer paper reports FLOPs falling with the budget s, no wall-clock "
    "time; at k = H/2 decode runs every head (docs/inference.md)",
}
LABEL = {"tsa": "TSA", "budget": "BudgetFormer"}


@dataclass(frozen=True)
class SpeedSizes:
    sizes: tuple[str, ...]
    vocab: int
    prompt: int
    new: int  # decode steps after the prompt
    batches: tuple[int, ...]
    repeats: int  # alternated rounds after a warm-up round
    dtype: torch.dtype


@dataclass(frozen=True)
class InferenceSizes:
    sizes: tuple[str, ...]
    vocab: int
    batch: int
    prompt: int
    new: int
    fast_dtype: torch.dtype
    speed: SpeedSizes


GPU = InferenceSizes(
    ("124M", "1.3B"), vocab=50257, batch=4, prompt=96, new=32, fast_dtype=torch.bfloat16,
    speed=SpeedSizes(("124M",), vocab=50257, prompt=512, new=128, batches=(1, 16), repeats=3,
                     dtype=torch.bfloat16),
)  # fmt: skip
CPU = InferenceSizes(
    ("nano",), vocab=256, batch=2, prompt=12, new=6, fast_dtype=torch.bfloat16,
    speed=SpeedSizes(("nano",), vocab=256, prompt=32, new=16, batches=(1, 16), repeats=3,
                     dtype=torch.float32),
)  # fmt: skip


def decode(model: torch.nn.Module, idx: torch.Tensor, prompt: int) -> tuple[torch.Tensor, float]:
    """Logits of every position of `idx` (B, T) through the KV cache (prefill `prompt`,
    then one token per call), and the decode steps' seconds."""
    sync = torch.cuda.synchronize if idx.is_cuda else (lambda: None)
    cache = KVCache.allocate(model, idx.size(0), idx.size(1))
    out = [forward_cached(model, idx[:, :prompt], cache)]
    sync()
    t0 = time.perf_counter()
    out += [forward_cached(model, idx[:, t : t + 1], cache) for t in range(prompt, idx.size(1))]
    sync()
    return torch.cat(out, dim=1), time.perf_counter() - t0


def inference_check(size: str, variant: str, error: float, executed: dict[str, float],
                    finite: bool, tok_s: float, dtype: str) -> Check:  # fmt: skip
    """The verdict of one (size, variant) from its measurements (no torch: testable alone)."""
    done = ", ".join(f"{k} {v:.2f}" for k, v in executed.items())
    return Check(
        f"inference {variant} {size}",
        f"fp32 cached decode equals the masked full forward within {MATCH_TOL:g} x max |logits| "
        f"at every position; {dtype} decode gives finite logits (tokens/s reported)",
        verdict(error <= MATCH_TOL and finite),
        f"max error {error:.1e} of max |logits| ({done}); {dtype} decode {tok_s:,.0f} tokens/s"
        + ("" if finite else ", NON-FINITE logits"),
    )


def speed_check(size: str, variant: str, phase: str, batch: int, seconds: dict[str, float],
                executed: dict[str, float], where: str) -> Check:  # fmt: skip
    """The verdict of one (variant, phase, batch) from the medians of the variant's and
    dense's seconds (no torch: testable alone)."""
    speedup = seconds["dense"] / seconds[variant]
    done = ", ".join(f"{k} {v:.2f}" for k, v in executed.items())
    return Check(
        f"inference speed {variant} {size} {phase} b{batch}",
        f"speed-up (dense's time / {LABEL[variant]}'s, {phase} at batch {batch}) >= "
        f"{SPEEDUP_GOAL:.1f} (at most 10% slower than dense); {PAPER_CLAIM[variant]}",
        verdict(speedup >= SPEEDUP_GOAL),
        f"{variant} {seconds[variant] * 1e3:.3g} ms, dense {seconds['dense'] * 1e3:.3g} ms: "
        f"speed-up {speedup:.2f}x ({done}; {where})",
    )


def on_cpu(check: Check) -> Check:
    """A speed row measured on the CPU: skipped, what the CPU measured beside why."""
    return Check(check.name, check.goal, "skipped", f"{NO_GPU}; CPU: {check.measured}")


def run(cpu: bool, out: Path) -> list[Check]:
    sizes, device = (CPU, "cpu") if cpu else (GPU, "cuda")
    tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32 for the match
    torch.backends.cudnn.allow_tf32 = False
    try:
        checks = match(sizes, device)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32
    speed_rows = [row for size in sizes.speed.sizes for row in speed(size, sizes.speed, device)]
    return checks + ([on_cpu(c) for c in speed_rows] if cpu else speed_rows)


def match(sizes: InferenceSizes, device: str) -> list[Check]:
    args = argparse.Namespace(vocab=sizes.vocab, prompt=sizes.prompt, tsa_alpha=TSA_ALPHA)
    total = sizes.prompt + sizes.new
    gen = torch.Generator().manual_seed(3)
    idx = torch.randint(0, sizes.vocab, (sizes.batch, total), generator=gen).to(device)
    dtype_name = str(sizes.fast_dtype).removeprefix("torch.")
    checks = []
    for size in sizes.sizes:
        for variant in VARIANTS:
            case = build_case(size, variant, total, device, torch.float32, args)
            model = case.model
            executed = executed_fraction(model, idx)
            with torch.no_grad():
                full = model(idx).logits
            cached, _ = decode(model, idx, sizes.prompt)
            error = float((cached - full).abs().max() / full.abs().max())
            del full, cached
            model.to(sizes.fast_dtype)
            decode(model, idx, sizes.prompt)  # warm-up
            fast, seconds = decode(model, idx, sizes.prompt)
            tok_s = sizes.batch * sizes.new / seconds
            finite = bool(torch.isfinite(fast).all())
            checks.append(
                inference_check(size, variant, error, executed, finite, tok_s, dtype_name)
            )
            del case, model, fast
            if device == "cuda":
                torch.cuda.empty_cache()
    return checks


@dataclass
class Phases:
    """One model's prefill of `prompt` (B, P) and decode of `tokens` (B, new) after it, on
    one cache, each a step to time: every call starts from the state it needs (the cache's
    length, BudgetFormer's running input sums), so no step times a fresh cache's set-up."""

    model: torch.nn.Module
    prompt: torch.Tensor
    tokens: torch.Tensor
    cache: KVCache
    after_prompt: torch.Tensor | None  # BudgetFormer's running sums after the prompt

    @classmethod
    def start(cls, model: torch.nn.Module, prompt: torch.Tensor, tokens: torch.Tensor) -> Phases:
        cache = KVCache.allocate(model, prompt.size(0), prompt.size(1) + tokens.size(1))
        forward_cached(model, prompt, cache, logits="last")
        pool = None if cache.pool_sum is None else cache.pool_sum.clone()
        return cls(model, prompt, tokens, cache, pool)

    def prefill(self) -> None:
        self.cache.length = 0
        if self.cache.pool_sum is not None:
            self.cache.pool_sum.zero_()
        forward_cached(self.model, self.prompt, self.cache, logits="last")

    def decode(self) -> None:
        self.cache.length = self.prompt.size(1)
        if self.after_prompt is not None:
            self.cache.pool_sum.copy_(self.after_prompt)
        for t in range(self.tokens.size(1)):
            forward_cached(self.model, self.tokens[:, t : t + 1], self.cache, logits="last")


def speed(size: str, sizes: SpeedSizes, device: str) -> list[Check]:
    """Dense, TSA and BudgetFormer of `size` timed alternately, one row per variant, phase
    and batch."""
    args = argparse.Namespace(vocab=sizes.vocab, prompt=sizes.prompt, tsa_alpha=TSA_ALPHA)
    capacity = sizes.prompt + sizes.new
    models = {v: build_case(size, v, capacity, device, sizes.dtype, args).model
              for v in ("dense", *VARIANTS)}  # fmt: skip
    gen = torch.Generator().manual_seed(1)
    widest = max(sizes.batches)
    prompt = torch.randint(0, sizes.vocab, (widest, sizes.prompt), generator=gen).to(device)
    tokens = torch.randint(0, sizes.vocab, (widest, sizes.new), generator=gen).to(device)
    executed = {v: executed_fraction(m, prompt) for v, m in models.items()}
    cuda = device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    where = torch.cuda.get_device_name() if cuda else "process CPU time"
    where += f", {str(sizes.dtype).removeprefix('torch.')}, median of {sizes.repeats}"
    calls = {"prefill": 1, "decode": sizes.new}  # decode: the seconds of one token's step
    about = {
        "prefill": f"one forward of batch x {sizes.prompt} tokens",
        "decode": f"per token, {sizes.new} steps after a {sizes.prompt}-token prompt",
    }
    seconds: dict[tuple[str, int], dict[str, float]] = {}
    for b in sizes.batches:
        phases = {v: Phases.start(m, prompt[:b], tokens[:b]) for v, m in models.items()}
        for phase in PHASES:
            steps = {v: getattr(p, phase) for v, p in phases.items()}
            wall, cpu = interleaved_times(steps, sizes.repeats, sync)
            times = wall if cuda else cpu
            seconds[phase, b] = {v: statistics.median(t) / calls[phase] for v, t in times.items()}
        del phases, steps
    return [
        speed_check(size, v, phase, b, seconds[phase, b], executed[v], f"{about[phase]}, {where}")
        for phase in PHASES
        for b in sizes.batches
        for v in VARIANTS
    ]
