"""analysis/results/verdict.py: the end-of-sweep summary in words, on a synthetic SweepFit
shaped like the demo's (dense, hadamard, budget, tsa at 3 sizes x 2 token budgets, one
seed), built from the real dataclasses the fit makes: no sweep is trained or fitted here."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from scalelab.analysis.results.advice import costing
from scalelab.analysis.results.fit import SweepFit
from scalelab.analysis.results.verdict import (
    fit_checks_line,
    next_line,
    paired_verdict,
    verdict_lines,
)
from scalelab.analysis.scaling import Interval
from scalelab.analysis.scaling.cells import Pairs
from scalelab.analysis.scaling.checks import FitCheck
from scalelab.analysis.scaling.paired import PairedGain
from scalelab.analysis.scaling.power_analysis import Advice, Option, Projection
from scalelab.orchestrator.plan.spec import parse_spec

DEMO = Path(__file__).resolve().parents[2] / "sweeps" / "demo.yaml"
AXES = ("model.size", "train.tokens")


def gain(variant: str, loss: tuple, m: tuple, flops_ratio: tuple) -> PairedGain:
    """A paired gain over 6 cells with the given loss ratio and multiplier (estimate, low,
    high) and the variant's FLOPs over dense's per cell (first and last; linear between)."""
    cells = tuple(((("model.size", s), ("train.tokens", t))) for s in (1, 2, 3) for t in (1, 2))
    base_flops = np.geomspace(1e10, 1e12, 6)
    ratio = np.linspace(*flops_ratio, 6)
    pairs = Pairs(variant, "dense", cells, np.zeros(6), np.full(6, 3.0 * loss[0]),
                  np.full(6, 3.0), base_flops * ratio, base_flops, 0)  # fmt: skip
    return PairedGain(variant, "dense", Interval(*m, 0.95), Interval(*loss, 0.95),
                      np.zeros(6), np.ones(6), 0.01, 0.01, 0.0, 6, 6, pairs)  # fmt: skip


BUDGET = gain("budget", (0.988, 0.9786, 0.9974), (0.95, 0.85, 1.06), (1.04, 1.07))
HADAMARD = gain("hadamard", (0.997, 0.989, 1.0051), (0.90, 0.79, 1.02), (0.98, 0.98))
TSA = gain("tsa", (0.9996, 0.9948, 1.0043), (1.01, 0.97, 1.05), (1.0, 1.0))


def demo_fit(paired: list[PairedGain], checks: dict[str, FitCheck] | None = None) -> SweepFit:
    return SweepFit("demo", "dense", "final_val_loss", 0.95, 24, 24,
                    ["budget", "dense", "hadamard", "tsa"], pa.table({"x": [0]}),
                    law_checks=checks or {}, paired=paired, axes=AXES)  # fmt: skip


def test_the_verdict_says_what_each_comparison_holds_fixed():
    lines = verdict_lines(demo_fit([BUDGET, HADAMARD, TSA]))
    assert lines[0] == "verdict: no variant beats dense at equal compute yet (95% intervals)"
    budget, hadamard, tsa = lines[1:]
    # lower loss at equal size and tokens, but more FLOPs: at equal compute, no clear gain
    assert budget == (
        "  budget: 1.2% lower loss than dense at equal size and tokens [-2.1%, -0.3%], but "
        "spends 4–7% more FLOPs: at equal compute, no clear gain (dense's loss at 0.95× the "
        "FLOPs [0.85×, 1.06×])"
    )
    assert hadamard.startswith(
        "  hadamard: no measurable difference from dense at equal size and tokens (loss "
        "-0.3% [-1.1%, +0.5%]); it uses 2% fewer FLOPs: at equal compute, no clear gain"
    )
    assert "on the same FLOPs" in tsa and "(loss -0.04% [-0.5%, +0.4%])" in tsa  # not -0.0%


def test_a_variant_that_beats_the_baseline_is_named_first():
    cheap = gain("hadamard", (0.98, 0.97, 0.99), (0.80, 0.72, 0.88), (0.9, 0.9))
    lines = verdict_lines(demo_fit([BUDGET, cheap]))
    assert lines[0].startswith("verdict: hadamard beats dense at equal compute; no clear gain")
    assert "and uses 10% fewer FLOPs: at equal compute, 20% cheaper" in lines[2]
    assert paired_verdict(cheap, ("tokens_per_param",)).count("equal tokens per parameter") == 1


def test_the_fit_checks_fold_into_one_line_that_points_at_the_report():
    loose = FitCheck(
        "E + A·C^-alpha", "", (), (0.01,), "", unidentified=("alpha's 95% CI reaches 0",)
    )
    wide = FitCheck("E + A·C^-alpha", "", (), (0.01,), "", wide=("A's 95% CI spans 9.7e+44x",))
    ok = FitCheck("E + A·C^-alpha", "", (), (0.01,), "")
    fit = demo_fit([BUDGET], {"budget": loose, "dense": loose, "hadamard": wide, "tsa": ok})
    assert fit_checks_line(fit) == (
        "fit checks: 3 of 4 laws to read with care (2 not pinned down by the data, 1 with an "
        "interval over an order of magnitude) — see 'Fits to read with care' in report.md"
    )
    assert (
        fit_checks_line(demo_fit([BUDGET], {"dense": ok})) == "fit checks: the 1 fitted law passes"
    )


def advice(measured: float, resolved: bool = False) -> Advice:
    def option(k: int) -> Option:
        return Option(f"{k} more seeds per cell", 6 * k, (), k * 1e13, 12 * k)

    never = Projection(Option("nothing", 0, (), 0.0, 0), 0.1, 0.3, False)
    return Advice("budget", "dense", 0.05, 0.95, 0.8, never, (), Projection(option(7), 0.04, 0.8, True),
                  measured, resolved, Projection(option(6), 0.05, 0.8, True))  # fmt: skip


def test_one_recommendation_per_variant_priced_on_the_sweeps_hardware():
    spec, _ = parse_spec(DEMO.read_text(), str(DEMO))
    cpu = costing(pa.table({"wall_time_s": [30.0, 60.0], "flops": [1e12, 2e12]}), spec)
    # measured 5.1% >= the 5% worth telling: the measured gain's addition, and only it
    line = next_line(advice(0.949), cpu)
    assert "6 more seeds" in line and "7 more seeds" not in line
    assert line.endswith("≈ 0.5 CPU-hours (1 core per trial, at the pace this sweep's trials ran))")
    # measured 2%, smaller than the 5% worth telling: the target's addition
    line = next_line(advice(0.98), cpu)
    assert "a gain as small as 5%" in line and "7 more seeds" in line and "6 more" not in line
    assert next_line(advice(0.8, resolved=True), cpu).startswith("budget: nothing to add")
    gpu_spec, _ = parse_spec(DEMO.read_text(), str(DEMO), ["backend.gpus_per_trial=1",
                                                           "backend.gpu=A100 80GB"])  # fmt: skip
    gpu = costing(pa.table({"wall_time_s": [30.0], "flops": [1e12]}), gpu_spec)
    assert "GPU-hours at 40% MFU on A100 80GB GPUs" in next_line(advice(0.949), gpu)
    assert "CPU" not in next_line(advice(0.949), gpu)


@pytest.mark.parametrize(
    ("flops", "words"),
    [
        ((1.0, 1.004), ", on the same FLOPs: "),
        ((0.97, 1.02), "; it spends from 3% fewer to 2% more FLOPs: "),
        ((0.94, 1.0), ", and uses up to 6% fewer FLOPs: "),
    ],
)
def test_the_flops_are_said_as_they_are(flops, words):
    line = paired_verdict(gain("tsa", (0.99, 0.98, 0.995), (0.9, 0.8, 0.99), flops), AXES)
    assert words in line
