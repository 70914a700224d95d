"""The compile part of the GPU acceptance run (benchmarks/acceptance/compile_speed.py): its
verdict on good and bad measurements, its time guard, and its CPU path."""

from __future__ import annotations

from pathlib import Path

from benchmarks.acceptance import compile_speed
from benchmarks.acceptance.checks import NO_GPU


def test_the_compiled_loss_must_match_eager_and_the_cold_compile_time_is_reported() -> None:
    good = compile_speed.compile_check("dense", 0.01, 2.0, 1.0, 61.4, "H100")
    bad = compile_speed.compile_check("dense", 2 * compile_speed.LOSS_TOL, 2.0, 1.0, 60, "")
    assert (good.status, bad.status) == ("pass", "fail")
    assert good.name == "compile vs eager dense 124M bf16"
    assert "eager / compiled 2.00x" in good.measured
    assert "cold compile + first step 61 s" in good.measured
    assert "vocabulary 50257" in good.goal


def test_a_variant_that_would_overrun_the_parts_time_is_skipped_saying_so() -> None:
    limit = compile_speed.VARIANTS_TIME_S
    assert compile_speed.fits(0.0, 0)
    assert compile_speed.fits(limit / 2 - 1, 1)
    assert not compile_speed.fits(limit / 2 + 1, 1)
    assert compile_speed.fits(limit * 2 / 3 - 1, 2)  # two variants averaged a third each
    row = compile_speed.out_of_time("hadamard", limit / 2 + 1, 1)
    assert (row.name, row.status) == ("compile vs eager hadamard 124M bf16", "skipped")
    assert row.measured.startswith("not measured:")


def test_the_cpu_path_skips_every_variant_saying_no_gpu(tmp_path: Path) -> None:
    checks = compile_speed.run(True, tmp_path)
    assert [c.name for c in checks] == [
        "compile vs eager dense 124M bf16", "compile vs eager hadamard 124M bf16"
    ]  # fmt: skip
    assert all(c.status == "skipped" and c.measured.startswith(NO_GPU) for c in checks)
