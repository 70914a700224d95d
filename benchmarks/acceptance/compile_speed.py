"""torch.compile against eager for the ladder's variants (sweeps/hadamard.yaml: dense and
hadamard) at 124M in bf16, batch 8 x 1024, with benchmarks/compile.py's `compare`: the
compiled model's losses must match eager's, and the forward + backward time ratio decides
the ladder sweeps' `train.compile` (docs/training.md). CPU: skipped (inductor's CPU build
takes minutes on a small machine; tests/models/test_compile.py compiles every variant at a
tiny size and matches eager's losses)."""

from __future__ import annotations

from benchmarks.acceptance.checks import NO_GPU, Check, verdict

VARIANTS = ("dense", "hadamard")
SIZE, BATCH, SEQ, REPEATS = "124M", 8, 1024, 10
LOSS_TOL = 0.02  # bf16: both modes round differently (the loss bf16 vs fp32 check's bound)
GOAL = (
    f"compiled loss within {LOSS_TOL:g} of eager's (bf16, the same weights, inputs and "
    "noise); eager / compiled forward + backward time reported: compile goes on in the "
    "ladder sweeps if it is faster for every variant"
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
        f"compiled {compiled_ms:.1f} ms = {eager_ms / compiled_ms:.2f}x; compile + first "
        f"step {compile_s:.0f} s ({where})",
    )


def run(cpu: bool) -> list[Check]:
    if cpu:
        why = f"{NO_GPU} (inductor's CPU build takes minutes here; tests/models/test_compile.py"
        why += " checks that every variant compiles and matches eager at a tiny size)"
        return [Check(name(v), GOAL, "skipped", why) for v in VARIANTS]
    import torch

    from benchmarks.compile import compare

    where = f"{torch.cuda.get_device_name()}, batch {BATCH} x {SEQ}, median of {REPEATS}"
    checks = []
    for variant in VARIANTS:
        r = compare(variant, SIZE, BATCH, SEQ, REPEATS, "cuda", "bf16")
        checks.append(
            compile_check(variant, r.loss_diff, r.eager_ms, r.compiled_ms, r.compile_s, where)
        )
    return checks
