"""The plan of each trial (orchestrator/plan/planner.py): what it counts, what it refuses, and
the smallest change it proposes. The memory model itself is checked against real engines
and autograd in test_memory_engines.py and test_memory_activations.py."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from scalelab.cli.main import app
from scalelab.jobs.gpus import GPUS
from scalelab.models.build import build
from scalelab.models.config import ModelConfig
from scalelab.models.flops import forward_flops_per_token
from scalelab.orchestrator.plan.expand import expand
from scalelab.orchestrator.plan.memory import PROCESS_HOST_BYTES, parameter_sizes
from scalelab.orchestrator.plan.planner import Placement, plan_sweep, plan_trial
from scalelab.orchestrator.plan.spec import SpecError, load_spec, parse_spec

SWEEPS = Path(__file__).resolve().parents[2] / "sweeps"
runner = CliRunner()


def _sweep(model: str, backend: str, batch: int = 65536, **deepspeed) -> str:
    """bf16 with DeepSpeed's bf16 gradient accumulation: ZeRO-0 (the default here) refuses
    fp32 accumulation (jobs/checks.py)."""
    ds = ", ".join(f"{k}: {v}" for k, v in deepspeed.items())
    return f"""
name: plan-test
base:
  model: {{size: {model}}}
  data: {{seq_len: 1024}}
  train: {{tokens: 1000000000, global_batch_tokens: {batch}, dtype: bf16, grad_accum_dtype: bf16}}
  deepspeed: {{{ds}}}
backend: {backend}
"""


def _plans(text: str):
    spec, source = parse_spec(text)
    trials = expand(spec, source)
    return spec, trials, plan_sweep(spec, trials)


@pytest.mark.parametrize(
    "model",
    [
        {"size": "micro"},
        {"size": "124M", "attn_out": "hadamard"},
        {"size": "mini", "budget": {}, "tsa": {}, "bias": False},
        {"size": "tiny", "task": "classify", "n_classes": 3, "tsa": {}},
    ],
)
def test_parameter_sizes_are_the_built_modules(model):
    cfg = ModelConfig(**model)
    built = [p.numel() for p in build(cfg, device="meta").parameters()]
    assert sorted(parameter_sizes(cfg)) == sorted(built)


ONE_A10 = "{kind: local, gpus_per_trial: 1, gpu: A10}"


def test_a_trial_that_does_not_fit_gets_the_largest_micro_batch_that_does():
    spec, trials, (plan,) = _plans(_sweep("350M", ONE_A10))  # 64 sequences per micro-batch
    usable = GPUS["A10"].memory_bytes * (1 - spec.estimate.memory_headroom)
    assert plan.fits is False and plan.peak_gpu_bytes > usable and plan.micro_batch == 64
    micro = plan.fix.changes["deepspeed.micro_batch_size"]
    assert list(plan.fix.changes) == ["deepspeed.micro_batch_size"]
    job = trials[0].job

    def with_micro(m: int):
        ds = job.deepspeed.model_copy(update={"micro_batch_size": m})
        return plan_trial(replace(trials[0], job=job.model_copy(update={"deepspeed": ds})), spec)

    assert with_micro(micro).fits and not with_micro(2 * micro).fits
    assert with_micro(micro).peak_gpu_bytes == plan.fix.peak_gpu_bytes
    # activations scale with the micro-batch; the model states do not
    small, large = with_micro(micro), with_micro(2 * micro)
    assert large.activations_bytes == pytest.approx(2 * small.activations_bytes, rel=1e-6)
    assert large.optimizer_bytes == small.optimizer_bytes


def test_when_the_model_states_do_not_fit_the_fix_shards_them():
    backend = (
        "{kind: slurm, gpu: A100 40GB, slurm: {nodes: 1, gpus_per_node: 8, tasks_per_node: 8}}"
    )
    spec, trials, (plan,) = _plans(_sweep("5.6B", backend, batch=2097152))
    assert plan.fits is False
    # ZeRO-0: 16 bytes per parameter on every GPU, more than an A100 40GB holds (the
    # padded vocabulary's rows included: models/vocab.py)
    held = 16 * sum(parameter_sizes(trials[0].job.model))
    assert plan.params_bytes + plan.grads_bytes + plan.optimizer_bytes == held
    fix = plan.fix.changes
    assert fix.get("deepspeed.zero_stage", 0) >= 1  # no micro-batch alone can fit it
    for key in fix:  # and no part of the fix alone does: it is the smallest
        alone = {k: v for k, v in fix.items() if k != key}
        if alone:
            text = _sweep(
                "5.6B",
                backend,
                batch=2097152,
                **{k.split(".")[1]: v for k, v in alone.items() if k.startswith("deepspeed.")},
            )
            assert _plans(text)[2][0].fits is False, alone


def test_no_gpu_model_no_verdict_and_nothing_refused(tmp_path, work_home):
    spec, trials, plans = _plans(_sweep("micro", "{kind: local}"))
    assert plans[0].fits is None and plans[0].wall_s is None and plans[0].peak_gpu_bytes > 0
    path = tmp_path / "cpu.yaml"
    path.write_text(_sweep("micro", "{kind: local, gpus_per_trial: 1}"))
    plan = json.loads(runner.invoke(app, ["submit", str(path), "--dry-run", "--json"]).stdout)
    assert plan["trials"][0]["plan"]["fits"] is None  # GPUs of an unnamed model


@pytest.mark.parametrize("zero_stage", [1, 3])
def test_host_ram_per_node_is_one_fp32_tensor_per_rank_at_every_stage(zero_stage):
    """Ranks place the model on the GPU module by module, whole (ZeRO 0-2,
    models.build.build_materialised) or partitioned (ZeRO-3, build_partitioned), drawing
    the largest tensor in fp32 on the host; before build_partitioned a ZeRO-3 rank built
    the whole fp32 model (8 x 22.6 GB per node at 5.6B, over mem_gb: 100)."""
    backend = "{kind: slurm, gpu: H100 SXM, slurm: {nodes: 2, gpus_per_node: 8, tasks_per_node: 8, mem_gb: 100}}"
    spec, trials, (plan,) = _plans(
        _sweep("5.6B", backend, batch=2097152, zero_stage=zero_stage, micro_batch_size=4)
    )
    largest = max(p.numel() for p in build(trials[0].job.model, device="meta").parameters())
    assert plan.host_bytes_per_node == 8 * (PROCESS_HOST_BYTES + 4 * largest)
    assert plan.fits is True  # 8 x (3 GiB + 0.8 GB) < mem_gb: 100


def test_wall_time_is_flops_over_mfu_peak_and_gpus():
    spec, _ = load_spec(SWEEPS / "hadamard.yaml")
    trials = expand(spec)
    place = Placement.of(spec)
    for trial, plan in zip(trials, plan_sweep(spec, trials), strict=True):
        job = trial.job
        steps = math.ceil(trial.tokens / job.train.global_batch_tokens)
        evals = math.ceil(steps / job.train.eval_interval)
        evals_flops = evals * job.data.val_tokens * forward_flops_per_token(job.model, 1024).total
        expected = (trial.flops + evals_flops) / (0.4 * 989e12 * place.gpus)
        assert plan.wall_s == pytest.approx(expected, rel=1e-9)
        assert plan.read_tokens == trial.tokens + job.data.val_tokens
        assert plan.time_limit_slices == math.ceil(plan.wall_s / (24 * 3600))


def test_the_hadamard_ladder_fits_and_finishes_5_6b_in_under_3_days():
    spec, _ = load_spec(SWEEPS / "hadamard.yaml")
    trials = expand(spec)
    plans = plan_sweep(spec, trials)
    assert all(p.fits for p in plans), [
        t.size for t, p in zip(trials, plans, strict=True) if not p.fits
    ]
    big = [p for t, p in zip(trials, plans, strict=True) if t.size == "5.6B"]
    assert big and max(p.wall_s for p in big) < 3 * 86400
    one_node = replace(Placement.of(spec), nodes=1)
    # the same trials on the one node the sweep used to ask for: two weeks
    assert plan_trial(trials[-1], spec, one_node).wall_s > 14 * 86400


def test_activation_checkpointing_costs_a_third_more_time_and_saves_memory():
    backend = "{kind: local, gpus_per_trial: 1, gpu: H100 SXM}"
    _, _, (plain,) = _plans(_sweep("350M", backend, micro_batch_size=8))
    _, _, (ckpt,) = _plans(
        _sweep("350M", backend, micro_batch_size=8, activation_checkpointing="true")
    )
    # the blocks keep 2h instead of ~16h per token; the LM head's bf16 logits, fp32
    # log-softmax and logits gradients (~12 bytes x 50257 per token) stay
    assert ckpt.activations_bytes < 0.55 * plain.activations_bytes
    assert ckpt.wall_s == pytest.approx(plain.wall_s * 4 / 3, rel=0.01)


def test_submit_refuses_a_trial_that_does_not_fit_before_creating_anything(tmp_path, monkeypatch):
    monkeypatch.setenv("SCALELAB_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    path = tmp_path / "big.yaml"
    path.write_text(_sweep("350M", ONE_A10))
    dry = runner.invoke(app, ["submit", str(path), "--dry-run"])
    assert dry.exit_code == 0 and "NO" in dry.stdout and "does not fit" in dry.stdout
    plan = json.loads(runner.invoke(app, ["submit", str(path), "--dry-run", "--json"]).stdout)
    numbers = plan["trials"][0]["plan"]
    assert numbers["fits"] is False and numbers["peak_gpu_bytes"] > numbers["usable_gpu_bytes"]
    assert numbers["fix"]["changes"] == {"deepspeed.micro_batch_size": 8}
    result = runner.invoke(app, ["submit", str(path)])
    assert result.exit_code == 2
    assert "do not fit, nothing submitted" in result.stderr
    assert "smallest change that fits: deepspeed.micro_batch_size: 8" in result.stderr
    assert "Traceback" not in result.output
    assert not any((tmp_path / "home").rglob("*"))  # no tracking store, no run


def test_an_unknown_gpu_is_a_clean_sweep_error():
    with pytest.raises(SpecError, match=r"backend\.gpu: .*unknown GPU 'H100'; known: H100 SXM"):
        parse_spec(_sweep("micro", "{kind: local, gpu: H100}"))


def test_the_planner_and_the_cli_import_no_torch():
    import subprocess
    import sys

    code = (
        "import sys, scalelab.cli.main, scalelab.orchestrator.plan.planner, scalelab.jobs.training.ds_config, scalelab.jobs.gpus; "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
