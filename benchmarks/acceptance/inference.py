"""TSA and BudgetFormer inference: cached decoding (models/decode.py) against the masked
full forward, and its speed in the model dtype.

Each model is benchmarks/inference.py's case at its stated operating point (TSA's routers
biased so that alpha = 0.726 of the routed token-layers run, so tokens do halt; BudgetFormer
at its initial budget, k = H/2 heads per token). Match: in fp32 (TF32 off), a prompt is
prefilled and the rest decoded one token at a time (halted tokens skip their FFN and
attention, unselected heads are not computed); every position's logits must equal those of
one full forward in eval mode (the masked computation: every token and head computed, the
gates applied) within MATCH_TOL x max |logits|. Then the model in the run's dtype (bf16 on
a GPU) decodes the same way: its logits must be finite, its decode tokens/s is reported.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

import torch

from benchmarks.acceptance.checks import Check, verdict
from benchmarks.inference import build_case, executed_fraction
from scalelab.models.decode import KVCache, forward_cached

VARIANTS = ("tsa", "budget")
MATCH_TOL = 1e-4  # of max |logits|: fp32 rounding of two orders of summation, no more


@dataclass(frozen=True)
class InferenceSizes:
    sizes: tuple[str, ...]
    vocab: int
    batch: int
    prompt: int
    new: int
    fast_dtype: torch.dtype


GPU = InferenceSizes(("124M", "1.3B"), vocab=50257, batch=4, prompt=96, new=32,
                     fast_dtype=torch.bfloat16)  # fmt: skip
CPU = InferenceSizes(("nano",), vocab=256, batch=2, prompt=12, new=6, fast_dtype=torch.bfloat16)


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


def run(cpu: bool) -> list[Check]:
    tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32 for the match
    torch.backends.cudnn.allow_tf32 = False
    try:
        return _run(CPU if cpu else GPU, "cpu" if cpu else "cuda")
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32


def _run(sizes: InferenceSizes, device: str) -> list[Check]:
    args = argparse.Namespace(vocab=sizes.vocab, prompt=sizes.prompt, tsa_alpha=0.726)
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
