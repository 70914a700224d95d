"""The training part of the GPU acceptance run (benchmarks/acceptance/training.py): the
largest ladder size the planner fits on a GPU, MFU in both attention conventions, its
verdicts on good and bad measurements, and its CPU path."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from benchmarks.acceptance import data_parallel, training
from benchmarks.acceptance.checks import NO_GPU, Check
from scalelab.jobs.gpus import gpu_spec
from scalelab.orchestrator.plan.planner import Placement
from scalelab.orchestrator.plan.spec import load_spec

ROOT = Path(__file__).resolve().parents[2]
MIB = 2**20


@pytest.fixture(scope="module")
def spec():
    return load_spec(training.SWEEP)[0]


def one_rank_on(gpu: str, memory_gib: float | None = None) -> Placement:
    found = gpu_spec(gpu)
    if memory_gib is not None:
        found = dataclasses.replace(found, memory_gib=memory_gib)
    return Placement(1, 1, 1, found, None)


def test_the_ladder_is_the_sweeps_sizes_largest_first(spec) -> None:
    assert training.ladder(spec) == ["5.6B", "2.7B", "1.3B", "760M", "350M", "124M"]


@pytest.mark.parametrize(
    ("gpu", "memory_gib", "chosen"),
    [("H100 SXM", None, "2.7B"), ("H200", None, "5.6B"), ("H100 SXM", 40, "760M")],
)
def test_the_planner_chooses_the_largest_ladder_size_that_fits(
    spec, gpu: str, memory_gib: float | None, chosen: str
) -> None:
    choice = training.largest_fit(spec, one_rank_on(gpu, memory_gib), steps=8)
    assert choice.trial is not None and choice.plan is not None
    assert (choice.case.sweep_size, choice.case.size, choice.trial.size) == (chosen, chosen, chosen)
    assert training.case_name(choice.case) == "train largest size that fits"
    plan, job = choice.plan, choice.trial.job
    assert plan.fits and (plan.world, plan.accumulation) == (1, 1)  # one micro-batch per step
    assert job.deepspeed.zero_stage == 1 and job.data.seq_len == 1024
    assert job.train.global_batch_tokens == job.deepspeed.micro_batch_size * 1024
    assert choice.trial.tokens == 8 * job.train.global_batch_tokens
    assert choice.why.startswith(f"{chosen}: the largest ladder size")
    assert gpu_spec(gpu).name in choice.why and "usable" in choice.why
    larger = training.ladder(spec)[: training.ladder(spec).index(chosen)]
    assert all(
        f"{size} needs" in choice.why for size in larger
    )  # what did not fit, and by how much


def test_without_a_known_gpu_or_one_that_fits_nothing_no_size_is_chosen(spec) -> None:
    unknown = training.largest_fit(spec, Placement(1, 1, 1, None, None), steps=8)
    assert (unknown.trial, unknown.plan) == (None, None)
    assert "jobs/gpus.py" in unknown.why
    tiny = training.largest_fit(spec, one_rank_on("L4", memory_gib=1), steps=8)
    assert (tiny.trial, tiny.plan) == (None, None)
    assert tiny.why.startswith("no ladder size fits one L4: 5.6B needs")
    assert "124M needs" in tiny.why
    rows = training.unmeasured_checks(tiny.case, 0.4, tiny.why)
    assert [c.status for c in rows] == ["skipped"] * 3
    assert all(c.measured == f"not measured: {tiny.why}" for c in rows)
    assert rows[0].name == "train largest size that fits: model states vs planner"


def test_mfu_counts_attention_over_the_full_square_and_over_the_causal_triangle(spec) -> None:
    """124M at T = 1024 by hand: per layer and token, 24 d^2 for the matrices (QKV 6, W_O 2,
    MLP 16) and 4 T d for attention's scores and weighted sum; the LM head 2 d V; training
    3x the forward. Causally, query t attends to t + 1 keys: (T + 1) / 2 on average."""
    model = training.sweep_trial(training.StepCase("124M", "124M"), spec, steps=1).job.model
    d, L, V, T = 768, 12, 50257, 1024
    full = 3 * (L * (24 * d * d + 4 * T * d) + 2 * d * V)
    causal = 3 * (L * (24 * d * d + 2 * (T + 1) * d) + 2 * d * V)
    m = training.Measured(tokens_per_s=100_000.0, states_bytes=1, peak_bytes=1,
                          forward_backward_s=0.05, optimizer_step_s=0.02,
                          micro_batch_tokens=8192)  # fmt: skip
    peak = 989e12
    u = training.utilisation(m, model, T, 1, peak)
    assert u is not None
    fb_rate = 8192 / 0.05
    assert u.forward_backward == pytest.approx(fb_rate * full / peak, rel=1e-12)
    assert u.forward_backward_causal == pytest.approx(fb_rate * causal / peak, rel=1e-12)
    assert u.step == pytest.approx(100_000 * full / peak, rel=1e-12)
    assert u.step_causal == pytest.approx(100_000 * causal / peak, rel=1e-12)
    attention_share = 3 * L * 4 * T * d / full  # 13.3% of 124M's training FLOPs
    assert u.forward_backward_causal / u.forward_backward == pytest.approx(
        1 - attention_share * (T - 1) / (2 * T), rel=1e-12
    )
    two = training.utilisation(m, model, T, 2, peak)  # the same rate over twice the peak
    assert two is not None and two.step == pytest.approx(u.step / 2)
    assert training.utilisation(m, model, T, 1, None) is None  # no peak (CPU, unknown GPU)


def measured(states: int, peak: int | None, fb_s: float = 0.02) -> training.Measured:
    return training.Measured(tokens_per_s=3e5, states_bytes=states, peak_bytes=peak,
                             forward_backward_s=fb_s, optimizer_step_s=0.01,
                             micro_batch_tokens=8192)  # fmt: skip


PLAN = type("Plan", (), {"peak_gpu_bytes": 1000 * MIB, "micro_batch": 8})()


def test_each_row_passes_on_a_good_measurement_and_fails_on_a_bad_one() -> None:
    case = training.StepCase("2.7B", "2.7B", label=training.LARGEST)

    def rows(states: int, peak: int, fb_mfu: float, step_mfu: float = 0.3) -> list[Check]:
        achieved = training.Utilisation(fb_mfu, 0.9 * fb_mfu, step_mfu, 0.9 * step_mfu)
        return training.step_checks(case, measured(states, peak), PLAN, 100 * MIB, 0.4,
                                    achieved, NO_GPU, about="2.7B: why")  # fmt: skip

    good = rows(105 * MIB, 1050 * MIB, 0.45)
    assert [c.status for c in good] == ["pass", "pass", "pass"]
    assert [c.name for c in good] == [
        "train largest size that fits: model states vs planner",
        "train largest size that fits: peak memory vs planner",
        "train largest size that fits: MFU",
    ]
    assert all(c.measured.endswith("; 2.7B: why") for c in good)  # which size, and why
    assert "one rank: no all-reduce" in good[1].measured and "unsharded" in good[1].measured
    mfu = good[2]
    assert "forward + backward MFU >= 40%" in mfu.goal and "full T x T" in mfu.goal
    assert "forward + backward 45.0% (causal 40.5%)" in mfu.measured
    assert "whole step 30.0% (causal 27.0%)" in mfu.measured  # reported, not judged
    assert "20.0 ms per micro-batch of 8 sequences, optimizer step 10.0 ms" in mfu.measured
    bad = rows(125 * MIB, 1250 * MIB, 0.35, step_mfu=0.5)
    assert [c.status for c in bad] == ["fail", "fail", "fail"]


def test_without_a_gpu_the_gpu_rows_are_skipped_beside_what_the_cpu_measured() -> None:
    case = training.CPU.cases[0]
    rows = training.step_checks(case, measured(100 * MIB, None), PLAN, 100 * MIB, 0.4, None,
                                NO_GPU)  # fmt: skip
    assert [c.status for c in rows] == ["pass", "skipped", "skipped"]
    assert all(c.measured.startswith(NO_GPU) for c in rows[1:])
    assert "300,000 tokens/s" in rows[2].measured and "20.0 ms" in rows[2].measured
    assert rows[0].name == "train 124M (as nano): model states vs planner"
    stand_in = training.CPU.largest.stand_in
    assert stand_in is not None
    assert training.case_name(stand_in) == "train largest size that fits (as micro)"


def test_running_out_of_cuda_memory_fails_the_peak_row_only() -> None:
    case = training.StepCase("5.6B", "5.6B", label=training.LARGEST)
    rows = training.unmeasured_checks(case, 0.4, "CUDA out of memory where ...", True)
    assert [c.status for c in rows] == ["skipped", "fail", "skipped"]
    assert rows[1].measured == "CUDA out of memory where ..."
    assert rows[0].measured == rows[2].measured == "not measured: CUDA out of memory where ..."


def test_the_world_steps_as_its_slowest_rank_over_every_ranks_tokens() -> None:
    a = dataclasses.replace(measured(50, 700, fb_s=0.02), tokens_per_s=1000.0)
    b = dataclasses.replace(measured(60, 650, fb_s=0.03), tokens_per_s=800.0)
    world = data_parallel.world_measurement([a, b])
    assert (world.tokens_per_s, world.states_bytes, world.peak_bytes) == (1600.0, 60, 700)
    assert (world.forward_backward_s, world.micro_batch_tokens) == (0.03, 2 * 8192)
    rows = training.step_checks(training.GPU.cases[0], world, PLAN, 60, 0.4, None, "x", ranks=2)
    assert rows[2].name == "train 124M on 2 ranks: MFU"
    assert "2 ranks: gradients all-reduced" in rows[1].measured
