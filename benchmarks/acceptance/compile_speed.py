"""torch.compile against eager for the ladder's variants (sweeps/hadamard.yaml: dense and
hadamard) at 124M in bf16 with the ladder's vocabulary (GPT-2's 50257), batch 8 x 1024,
with benchmarks/compile.py's `compare`: the compiled model's losses must match eager's, and
the forward + backward time ratio decides the ladder sweeps' `train.compile`
(docs/training.md). Each variant compiles cold, in fresh inductor and Triton cache folders
under the part's output folder (scripts/gpu-acceptance.sh otherwise keeps one cache across
runs), and its compile + first step seconds stand beside its ratio; the first variant also
pays inductor's start-up in this process. A variant that would not finish within the
part's time is skipped, saying so, so the rows measured before it are kept. CPU: skipped
(inductor's CPU build takes minutes on a small machine; tests/models/test_compile.py
compiles every variant at a tiny size and matches eager's losses)."""

from __future__ import annotations

import time
import traceback
from pathlib import Path

from benchmarks.acceptance.checks import NO_GPU, Check, verdict

VARIANTS = ("dense", "hadamard")
SIZE, VOCAB, BATCH, SEQ, REPEATS = "124M", 50257, 8, 1024, 10
LOSS_TOL = 0.02  # bf16: both modes round differently (the loss bf16 vs fp32 check's bound)
# The variants' share of the part's GPU budget (benchmarks/acceptance/parts.py), less the
# process's start-up (imports, CUDA context)
VARIANTS_TIME_S = 125.0
GOAL = (
    f"compiled loss within {LOSS_TOL:g} of eager's (bf16, vocabulary {VOCAB}, the same "
    "weights, inputs and noise); eager / compiled forward + backward time and the cold "
    "compile time reported: compile goes on in the ladder sweeps if it is faster for every "
    "variant"
)


def name(variant: str) -> str:
    return f"compile vs eager {variant} {SIZE} bf16"


def compile_check(variant: str, loss_diff: float, eager_ms: float, compiled_ms: float,
                  compile_s: float, where: str) -> Check:  # fmt: skip
    """The verdict of one variant from its measurements (no torch: testable alone)."""
    return Check(
        name(variant),
        GOAL,
        verdict(loss_diff <= LOSS_TOL),
        f"max loss difference {loss_diff:.1e}; forward + backward eager {eager_ms:.1f} ms, "
        f"compiled {compiled_ms:.1f} ms: eager / compiled {eager_ms / compiled_ms:.2f}x; "
        f"cold compile + first step {compile_s:.0f} s ({where})",
    )


def fits(spent_s: float, done: int, limit_s: float = VARIANTS_TIME_S) -> bool:
    """Whether one more variant fits in `limit_s`, expecting it to take as long as the
    `done` variants before it did on average."""
    return done == 0 or spent_s + spent_s / done <= limit_s


def out_of_time(variant: str, spent_s: float, done: int) -> Check:
    return Check(
        name(variant),
        GOAL,
        "skipped",
        f"not measured: {done} variant(s) took {spent_s:.0f} s, one more would overrun the "
        f"{VARIANTS_TIME_S:.0f} s the part has for its variants",
    )


def run(cpu: bool, out: Path) -> list[Check]:
    if cpu:
        why = f"{NO_GPU} (inductor's CPU build takes minutes here; tests/models/test_compile.py"
        why += " checks that every variant compiles and matches eager at a tiny size)"
        return [Check(name(v), GOAL, "skipped", why) for v in VARIANTS]
    import torch
    from torch._inductor.utils import fresh_cache

    from benchmarks.compile import compare

    where = f"{torch.cuda.get_device_name()}, batch {BATCH} x {SEQ}, median of {REPEATS}"
    caches = out / "compiler-caches"
    caches.mkdir(parents=True, exist_ok=True)
    checks: list[Check] = []
    started = time.monotonic()
    for variant in VARIANTS:
        spent = time.monotonic() - started
        if not fits(spent, len(checks)):
            checks.append(out_of_time(variant, spent, len(checks)))
            continue
        try:
            with fresh_cache(dir=str(caches)):  # cold: empty inductor and Triton caches
                r = compare(variant, SIZE, BATCH, SEQ, REPEATS, "cuda", "bf16", VOCAB)
        except Exception as e:  # one variant that does not compile leaves the other's row
            traceback.print_exc()
            checks.append(Check(name(variant), GOAL, "fail", f"{type(e).__name__}: {e}"[:500]))
            continue
        checks.append(
            compile_check(variant, r.loss_diff, r.eager_ms, r.compiled_ms, r.compile_s, where)
        )
        torch.cuda.empty_cache()
    return checks
