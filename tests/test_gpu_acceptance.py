"""scripts/gpu-acceptance.sh --cpu, as CI runs it: one command, a JSON and a Markdown
summary, every check with a goal and a status, and nothing claimed for a GPU not present;
each check's verdict fails on a bad measurement; the GPU path takes the sweep's settings."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu-acceptance.sh"
NO_GPU = "not measured: no GPU"


@pytest.mark.slow
def test_the_cpu_path_runs_and_summarises_every_check(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("SCALELAB_HOME", "RANK", "WORLD_SIZE")}
    proc = subprocess.run(
        ["bash", str(SCRIPT), "--cpu", "--out", str(tmp_path)],
        capture_output=True, text=True, env=env, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((tmp_path / "acceptance.json").read_text())
    checks = {c["name"]: c for c in summary["checks"]}
    assert summary["mode"] == "cpu"
    passed = {name for name, c in checks.items() if c["status"] == "pass"}
    skipped = {name for name, c in checks.items() if c["status"] == "skipped"}
    assert passed == {
        "loss bf16 vs fp32",
        "Hadamard vs dense block nano bf16",
        "Hadamard vs dense block micro bf16",
        "train 124M (as nano): model states vs planner",
        "train 1.3B (as micro): model states vs planner",
        "train 124M (as nano) on 2 ranks: model states vs planner",  # ZeRO-1 sharded 2 ways
        "checkpoint save and load",
        "inference tsa nano",
        "inference budget nano",
    }
    assert skipped == {  # no GPU numbers on the CPU path, and each says so
        "GPU tests",
        "train 124M (as nano): peak memory vs planner",
        "train 124M (as nano): MFU",
        "train 1.3B (as micro): peak memory vs planner",
        "train 1.3B (as micro): MFU",
        "train 124M (as nano) on 2 ranks: peak memory vs planner",
        "train 124M (as nano) on 2 ranks: MFU",
        "compile vs eager dense 124M bf16",
        "compile vs eager hadamard 124M bf16",
    }
    assert all(checks[name]["measured"].startswith(NO_GPU) for name in skipped)
    for name in ("train 124M (as nano): MFU", "train 124M (as nano) on 2 ranks: MFU"):
        assert "tokens/s" in checks[name]["measured"]  # what the CPU measured
    assert all(c["goal"] for c in checks.values())
    table = (tmp_path / "acceptance.md").read_text()
    assert table.count("\n| ") == len(checks) + 1  # one row per check (and the header)


def test_without_a_gpu_and_without_cpu_it_refuses_with_one_line(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    proc = subprocess.run(
        ["bash", str(SCRIPT), "--out", str(tmp_path)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == "gpu-acceptance: no CUDA device here; use --cpu for the CPU path"
    assert not (tmp_path / "acceptance.json").exists()


def test_each_verdict_fails_on_a_bad_measurement() -> None:
    from benchmarks.acceptance import blocks, compile_speed, inference, loss, training

    case, mib = training.StepCase("124M", "124M"), 2**20
    plan = type("Plan", (), {"peak_gpu_bytes": 1000 * mib, "micro_batch": 8})()

    def statuses(states: int, peak: int | None, achieved: float | None) -> list[str]:
        m = training.Measured(tokens_per_s=1e5, states_bytes=states, peak_bytes=peak)
        checks = training.step_checks(case, m, plan, 100 * mib, 0.4, achieved, NO_GPU)
        return [c.status for c in checks]

    assert statuses(105 * mib, 1050 * mib, 0.45) == ["pass", "pass", "pass"]
    assert statuses(125 * mib, 1250 * mib, 0.30) == ["fail", "fail", "fail"]
    assert statuses(100 * mib, None, None) == ["pass", "skipped", "skipped"]
    ms = {"dense": 1.0, "hadamard": 1.0}
    assert blocks.block_check("124M", {"dense": 1e-3, "hadamard": 1.5e-3}, ms, "").status == "pass"
    assert blocks.block_check("124M", {"dense": 1e-3, "hadamard": 3e-3}, ms, "").status == "fail"
    assert inference.inference_check("124M", "tsa", 1e-6, {}, True, 1.0, "bf16").status == "pass"
    assert inference.inference_check("124M", "tsa", 1e-2, {}, True, 1.0, "bf16").status == "fail"
    assert inference.inference_check("124M", "tsa", 1e-6, {}, False, 1.0, "bf16").status == "fail"
    steps = loss.CPU.steps
    assert loss.loss_check(loss.CPU, [3.0] * steps, [3.01] * steps, (1, 1)).status == "pass"
    assert loss.loss_check(loss.CPU, [3.0] * steps, [3.1] * steps, (1, 1)).status == "fail"
    assert loss.loss_check(loss.CPU, [3.0] * steps, [3.0] * 3, (1, 1)).status == "fail"
    assert compile_speed.compile_check("dense", 0.01, 2.0, 1.0, 60, "").status == "pass"
    assert compile_speed.compile_check("dense", 0.05, 2.0, 1.0, 60, "").status == "fail"


def test_a_resume_that_restores_nothing_is_a_difference() -> None:
    torch = pytest.importorskip("torch")
    from benchmarks.acceptance.training import differences

    saved = {"module.w": torch.ones(3, dtype=torch.bfloat16), "optimizer.step": 2}
    assert differences(saved, dict(saved)) == []
    assert differences(saved, {**saved, "module.w": torch.ones(3)}) == ["module.w"]  # dtype
    assert differences(saved, {**saved, "optimizer.step": 1}) == ["optimizer.step"]
    assert differences(saved, {"module.w": saved["module.w"]}) == ["optimizer.step"]


def test_the_gpu_cases_are_the_sweeps_trials_and_fit_one_gpu() -> None:
    """What the GPU path would run (no CUDA needed): the sweep's dense 124M and 1.3B trials
    with their dtype, ZeRO stage, micro-batch and sequence, one micro-batch per step, which
    the planner says fit one H100."""
    from benchmarks.acceptance import training
    from scalelab.jobs.gpus import gpu_spec
    from scalelab.orchestrator.expand import expand
    from scalelab.orchestrator.planner import Placement, plan_trial
    from scalelab.orchestrator.spec import load_spec

    spec, _ = load_spec(training.SWEEP)
    for case in training.GPU.cases:
        row = next(t for t in expand(spec) if t.size == case.sweep_size and t.variant == "dense")
        trial = training.sweep_trial(case, spec, steps=14)
        job, sweep = trial.job, row.job
        assert job.model == sweep.model
        assert job.deepspeed == sweep.deepspeed
        assert (job.train.dtype, job.train.grad_accum_dtype) == ("bf16", "fp32")
        assert job.data.seq_len == sweep.data.seq_len == 1024
        assert job.train.global_batch_tokens == sweep.deepspeed.micro_batch_size * 1024
        assert trial.tokens == 14 * job.train.global_batch_tokens
        plan = plan_trial(trial, spec, Placement(1, 1, 1, gpu_spec("H100 SXM"), None))
        assert (plan.world, plan.accumulation, plan.fits) == (1, 1, True)
    eight = training.sweep_trial(training.GPU.cases[0], spec, steps=14, ranks=8)  # data_parallel
    assert eight.tokens == 14 * 8 * eight.job.deepspeed.micro_batch_size * 1024
    plan = plan_trial(eight, spec, training.placement_here("cpu", 8))
    assert (plan.world, plan.accumulation) == (8, 1)  # one micro-batch per rank and step


def test_the_world_is_as_fast_as_its_slowest_rank_and_as_big_as_its_largest() -> None:
    from benchmarks.acceptance import data_parallel, training

    ranks = [training.Measured(1000.0, 50, 700), training.Measured(800.0, 60, 650)]
    world = data_parallel.world_measurement(ranks)
    assert (world.tokens_per_s, world.states_bytes, world.peak_bytes) == (1600.0, 60, 700)
    on_cpu = data_parallel.world_measurement([training.Measured(10.0, 5, None)] * 2)
    assert on_cpu.peak_bytes is None


def test_one_gpu_skips_the_data_parallel_check_saying_so(tmp_path: Path, monkeypatch) -> None:
    from benchmarks.acceptance import data_parallel

    monkeypatch.setattr(data_parallel, "ranks_here", lambda cpu: 1)  # a 1-GPU machine
    [check] = data_parallel.run(False, tmp_path)
    assert (check.name, check.status) == ("train 124M on every GPU", "skipped")
    assert check.measured == "needs 2 or more GPUs; 1 CUDA device here"
    assert not (tmp_path / data_parallel.RESULT_FILE).exists()
