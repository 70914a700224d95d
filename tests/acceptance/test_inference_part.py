"""The inference part of the GPU acceptance run (benchmarks/acceptance/inference.py): its
verdicts on good and bad measurements, the timed steps' state, and its CPU path."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from benchmarks.acceptance import inference
from benchmarks.acceptance.checks import NO_GPU


def test_the_match_fails_on_an_error_over_the_tolerance_or_non_finite_logits() -> None:
    def status(error: float, finite: bool) -> str:
        return inference.inference_check("124M", "tsa", error, {}, finite, 1.0, "bf16").status

    assert status(1e-6, True) == "pass"
    assert status(2 * inference.MATCH_TOL, True) == "fail"
    assert status(1e-6, False) == "fail"


@pytest.mark.parametrize("variant", inference.VARIANTS)
def test_a_speed_row_fails_when_the_variant_is_over_ten_percent_slower_than_dense(
    variant: str,
) -> None:
    executed = {"alpha": 0.73} if variant == "tsa" else {"heads": 0.5}

    def check(dense_s: float, variant_s: float) -> inference.Check:
        seconds = {"dense": dense_s, variant: variant_s}
        return inference.speed_check("124M", variant, "decode", 16, seconds, executed, "H100")

    faster, slower, near = check(4e-3, 3e-3), check(3e-3, 4e-3), check(3e-3, 3.2e-3)
    assert (faster.status, slower.status, near.status) == ("pass", "fail", "pass")
    assert faster.name == f"inference speed {variant} 124M decode b16"
    assert "speed-up 1.33x" in faster.measured and "speed-up 0.75x" in slower.measured
    assert ">= 0.9" in faster.goal and "paper" in faster.goal


def test_a_speed_row_measured_on_the_cpu_is_skipped_beside_what_the_cpu_measured() -> None:
    seconds = {"dense": 2e-3, "tsa": 1e-3}
    measured = inference.speed_check("nano", "tsa", "prefill", 1, seconds, {}, "CPU")
    row = inference.on_cpu(measured)
    assert (row.name, row.goal, row.status) == (measured.name, measured.goal, "skipped")
    assert row.measured.startswith(NO_GPU) and "speed-up 2.00x" in row.measured


def test_every_timed_call_starts_from_the_state_its_phase_needs() -> None:
    """Alternated calls of prefill and decode on one cache compute what one fresh prefill
    and decode compute: the decode's cache and BudgetFormer's running sums are reset, not
    grown (a decode that started where the last one ended would time another sequence)."""
    torch = pytest.importorskip("torch")
    from benchmarks.inference import build_case
    from scalelab.models.decode import KVCache, forward_cached

    args = argparse.Namespace(vocab=256, prompt=8, tsa_alpha=inference.TSA_ALPHA)
    model = build_case("nano", "budget", 12, "cpu", torch.float32, args).model
    gen = torch.Generator().manual_seed(0)
    prompt, tokens = (torch.randint(0, 256, (2, n), generator=gen) for n in (8, 4))
    phases = inference.Phases.start(model, prompt, tokens)
    for step in (phases.decode, phases.prefill, phases.decode, phases.decode):
        step()
    fresh = KVCache.allocate(model, 2, 12)
    forward_cached(model, prompt, fresh)
    for t in range(4):
        forward_cached(model, tokens[:, t : t + 1], fresh)
    assert phases.cache.length == fresh.length == 12
    torch.testing.assert_close(phases.cache.pool_sum, fresh.pool_sum)
    torch.testing.assert_close(phases.cache.k, fresh.k)


def test_the_cpu_path_passes_the_match_and_skips_every_speed_row(tmp_path: Path) -> None:
    checks = inference.run(True, tmp_path)
    by_status = {s: {c.name for c in checks if c.status == s} for s in ("pass", "skipped")}
    assert by_status["pass"] == {"inference tsa nano", "inference budget nano"}
    assert by_status["skipped"] == {
        f"inference speed {v} nano {phase} b{b}"
        for v in ("tsa", "budget") for phase in ("prefill", "decode") for b in (1, 16)
    }  # fmt: skip
    assert len(checks) == 10  # nothing failed, one row a question
    skipped = [c for c in checks if c.status == "skipped"]
    assert all(c.measured.startswith(NO_GPU) and "speed-up" in c.measured for c in skipped)
