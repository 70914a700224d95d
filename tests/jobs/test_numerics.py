"""bf16 numerics: gradients accumulated and reduced in fp32 (DeepSpeed's own report, ZeRO
1-3; refused at stage 0), deepspeed.extra unable to change it, the trial id naming it; on the
real ZeRO-2 engine, the gradient of 8 (and 64) micro-batches accumulated in fp32 closer to the
exact one than one micro-batch of 8 and than bf16 accumulation; and on 2 gloo ranks, 8
accumulation steps tracking the fp32 loss curve as closely as one step does (within the
seeds' spread, which is all a curve resolves), with losses logged in fp32."""

import copy
import json

import pytest
import torch
from two_ranks import train_on_two_ranks
from typer.testing import CliRunner

from scalelab.jobs.checks import check_placement
from scalelab.jobs.config import JobCheckError
from scalelab.jobs.data.reader import TrainStream
from scalelab.jobs.data.trial import open_data, prepare, train_windows
from scalelab.jobs.training.ds_config import deepspeed_config, plan_batch


@pytest.mark.slow
@pytest.mark.distributed
def test_bf16_with_8_accumulation_steps_tracks_fp32(home, tmp_path, tiny_job, curve):
    """Train loss of 12 steps, each of 16 sequences: 2 ranks x 8 micro-batches of 1, or
    2 ranks x 1 micro-batch of 8; |bf16 - fp32| averaged over the steps. Every split reads
    the same 16 sequences at a step (jobs/data/reader.py), and the fp32 curve does not depend on
    it (1 step vs 8: at most 1e-6 apart, seeds 0-4), so the cheaper one is the reference."""
    steps = 12
    common = {"train__tokens": 512 * steps, "train__global_batch_tokens": 512,
              "train__eval_interval": 1000, "deepspeed__zero_stage": 2}  # fmt: skip
    x8 = {**common, "deepspeed__micro_batch_size": 1}
    x1 = {**common, "deepspeed__micro_batch_size": 8}
    cases = {
        "fp32": tiny_job(**x1),
        "bf16 x8": tiny_job(**x8, train__dtype="bf16"),
        "bf16 x1": tiny_job(**x1, train__dtype="bf16"),
    }
    homes = [tmp_path / f"run{i}" for i in range(len(cases))]
    train_on_two_ranks(list(zip(homes, cases.values(), strict=True)), tmp_path)
    losses = {
        name: [v for _, v in curve(home, job.trial_id, "train/loss")]
        for (name, job), home in zip(cases.items(), homes, strict=True)
    }
    assert all(len(v) == steps for v in losses.values())
    gap = {
        name: sum(abs(a - b) for a, b in zip(v, losses["fp32"], strict=True)) / steps
        for name, v in losses.items()
        if name != "fp32"
    }
    print(f"mean |loss - fp32 loss| over {steps} steps: {gap}")
    print(json.dumps(losses))
    # 8 steps as close as 1 within what a loss curve can resolve: x8/x1 was 1.00, 0.98,
    # 0.96, 1.02, 0.96 for seeds 0-4 (0.95-1.19 over 8 or 16 steps: the trajectories part
    # and meet again); the gradient itself is compared without that noise below
    assert gap["bf16 x8"] <= 1.25 * gap["bf16 x1"], gap
    # both well inside what a bf16 loss can resolve: rounding this curve's losses to bf16
    # moves them by ~0.006 on average; the gaps are 0.19-0.28 of that (seeds 0-4), and were
    # 0.70 (x8) and 2.2 (x1) of it with the bf16 loss and accumulation (docs/training.md)
    rounding = sum(abs(float(torch.tensor(v).bfloat16()) - v) for v in losses["fp32"]) / steps
    assert max(gap.values()) < rounding / 2, (gap, rounding)
    # logged in fp32: a bf16-rounded loss (8.3671875) is one of 128 values in [8, 16)
    assert not all(float(torch.tensor(v).bfloat16()) == v for v in losses["bf16 x1"])


def _first_sequences(job, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The first n training sequences of `job`'s data order (inputs, targets)."""
    windows = train_windows(job.train.tokens, job.train.global_batch_tokens, job.data.seq_len)
    root = prepare(job.data, job.seed, job.model, windows)
    data = open_data(job.data, job.seed, root, job.model, windows)
    (batch,) = TrainStream(data, job.seed, n, 1, 0, 1).micro_batches(0)
    return torch.from_numpy(batch.x), torch.from_numpy(batch.y)


def _gradient_error(job, engine_of, x, y) -> float:
    """|g - g_exact| / |g_exact|: g is what the engine holds at the step's boundary (before the
    update) after the training loop's forward/backward/step over x in micro-batches of
    `job`'s size; g_exact is the float64 gradient of the same bf16 weights over all of x."""
    from deepspeed.utils import safe_get_full_grad

    micro = job.deepspeed.micro_batch_size
    with engine_of(job) as engine:
        exact = copy.deepcopy(engine.module).double()
        exact(x, y).loss.backward()
        for i in range(0, len(x), micro):
            engine.backward(engine(x[i : i + micro], y[i : i + micro]).loss)
            if i + micro < len(x):
                engine.step()  # not a boundary: counts the micro-step only
        assert engine.is_gradient_accumulation_boundary()
        params = zip(engine.module.parameters(), exact.parameters(), strict=True)
        pairs = [(safe_get_full_grad(p), e.grad) for p, e in params]
    diff = sum(float((g.double() - ref).square().sum()) for g, ref in pairs)
    return (diff / sum(float(ref.square().sum()) for _, ref in pairs)) ** 0.5


@pytest.mark.slow  # five engines
def test_fp32_accumulation_of_8_and_64_micro_batches_is_closer_to_the_exact_gradient(
    home, tiny_job, engine_of
):
    """The issue's criterion without the loss curve's seed noise: one gradient, same bf16
    weights, same sequences, ZeRO-2 on the real engine. Measured (seeds 0/1/2): 8 sequences,
    one micro-batch 3.20/3.27/3.44e-3, 8 accumulated in fp32 2.72/2.56/2.61e-3, in bf16
    4.15/4.02/4.13e-3; 64 sequences in fp32 1.21/1.12/1.27e-3, in bf16 7.88/7.82/7.97e-3
    (torch's CPU LayerNorm backward sums its weight and bias gradients over a micro-batch's
    rows in bf16, so one large micro-batch is the worse; docs/training.md, "Numerics")."""
    x, y = _first_sequences(tiny_job(train__global_batch_tokens=64 * 32), 64)

    def error(n: int, micro: int, accum: str) -> float:
        job = tiny_job(train__dtype="bf16", train__grad_accum_dtype=accum, deepspeed__zero_stage=2,
                       deepspeed__micro_batch_size=micro, train__global_batch_tokens=n * 32)  # fmt: skip
        return _gradient_error(job, engine_of, x[:n], y[:n])

    one_of_8, fp32_8, bf16_8 = error(8, 8, "fp32"), error(8, 1, "fp32"), error(8, 1, "bf16")
    fp32_64, bf16_64 = error(64, 1, "fp32"), error(64, 1, "bf16")
    print(f"8 sequences: one micro-batch {one_of_8:.3e}, fp32 {fp32_8:.3e}, bf16 {bf16_8:.3e}")
    print(f"64 sequences: fp32 {fp32_64:.3e}, bf16 {bf16_64:.3e}")
    assert fp32_8 <= one_of_8  # 8 accumulation steps at least as close as one step
    assert fp32_8 < bf16_8 and fp32_64 < bf16_64
    assert bf16_64 / fp32_64 > bf16_8 / fp32_8  # what bf16 sums lose grows with their length


@pytest.mark.slow  # three engines
@pytest.mark.parametrize(
    ("stage", "optimizer"),
    [(1, "BF16_Optimizer"), (2, "DeepSpeedZeroOptimizer"), (3, "DeepSpeedZeroOptimizer_Stage3")],
)
def test_bf16_engines_accumulate_and_reduce_gradients_in_fp32(stage, optimizer, home, tiny_job,
                                                             engine_of):  # fmt: skip
    job = tiny_job(train__dtype="bf16", deepspeed__zero_stage=stage, deepspeed__micro_batch_size=4)
    with engine_of(job) as engine:
        assert engine.get_data_types() == (torch.bfloat16, torch.float32)  # model, grad_accum
        assert engine.communication_data_type == torch.float32
        assert type(engine.optimizer).__name__ == optimizer
        x = torch.randint(0, job.model.vocab_size, (4, job.data.seq_len))
        engine.backward(engine(x, x).loss)  # the first of 2 micro-batches: accumulated ...
        held = engine.optimizer.fp32_groups_gradients_flat if stage == 1 else [
            t for ts in engine.optimizer.averaged_gradients.values() for t in ts
        ]  # fmt: skip
        assert held and all(t.dtype == torch.float32 for t in held)  # ... in fp32


def test_zero_stage_0_refuses_fp32_accumulation_of_bf16_gradients(tiny_job):
    job = tiny_job(train__dtype="bf16")
    with pytest.raises(JobCheckError, match="set deepspeed.zero_stage to 1") as caught:
        check_placement(job, 1, "cpu")
    assert caught.value.keys[0] == "deepspeed.zero_stage"
    check_placement(tiny_job(train__dtype="bf16", deepspeed__zero_stage=1), 1, "cpu")
    check_placement(tiny_job(train__dtype="bf16", train__grad_accum_dtype="bf16"), 1, "cpu")


def test_generated_config_follows_grad_accum_dtype(tiny_job):
    def ds(**kw):
        job = tiny_job(deepspeed__zero_stage=2, **kw)
        return deepspeed_config(job, plan_batch(job, 1), "cpu")

    assert "data_types" not in ds() and "communication_data_type" not in ds()  # fp32
    bf16 = ds(train__dtype="bf16")
    assert bf16["data_types"] == {"grad_accum_dtype": "fp32"}
    assert bf16["communication_data_type"] == "fp32"
    assert bf16["zero_optimization"]["overlap_comm"] is True
    assert (
        ds(train__dtype="bf16", train__grad_accum_dtype="bf16")["communication_data_type"] == "bf16"
    )


def test_the_gradient_dtype_is_in_the_trial_id_and_compile_is_not(tiny_job):
    fp32 = tiny_job()
    assert "grad_accum_dtype" not in fp32.identity_tree()["train"]  # fp32 trials keep their ids
    assert tiny_job(train__grad_accum_dtype="fp32").trial_id == fp32.trial_id
    bf16 = tiny_job(train__dtype="bf16")
    assert bf16.train.grad_accum_dtype == "fp32"
    assert tiny_job(train__dtype="bf16", train__grad_accum_dtype="bf16").trial_id != bf16.trial_id
    assert tiny_job(train__compile=True).trial_id == fp32.trial_id
    with pytest.raises(ValueError, match="needs dtype='bf16'"):
        tiny_job(train__grad_accum_dtype="bf16")


@pytest.mark.parametrize(
    "key", ["data_types", "communication_data_type", "bf16", "gradient_clipping"]
)
def test_deepspeed_extra_cannot_change_the_numerics(key, home, tmp_path):
    from scalelab.cli.main import app

    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(
        "name: extra\nbase:\n  model: {size: nano, vocab_size: 256, block_size: 32}\n"
        "  data: {seq_len: 32}\n  train: {tokens: 512, global_batch_tokens: 256, dtype: bf16}\n"
        f"  deepspeed:\n    zero_stage: 1\n    extra: {{{key}: {{}}}}\n"
    )
    result = CliRunner().invoke(app, ["submit", str(sweep), "--dry-run"])
    assert result.exit_code == 2, result.output
    assert (
        f"sweep.yaml:8: base.deepspeed.extra: deepspeed.extra may not set '{key}'" in result.output
    )
