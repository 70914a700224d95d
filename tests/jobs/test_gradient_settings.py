"""Issue 26, item 6b: the gradient settings reach DeepSpeed's engine and the planner counts
what each keeps (orchestrator/plan/memory.py); BF16_Optimizer (ZeRO-1, bf16, fp32 accumulation:
the ladder's setting) sums each micro-batch's gradient once."""

import pytest
import torch

from scalelab.jobs.training.ds_config import deepspeed_config, plan_batch
from scalelab.orchestrator.plan.memory import ZeroSettings, model_state_bytes, parameter_sizes

BUCKET = 1_234_567


def _job(tiny_job, stage: int = 1, overlap: bool = False):
    return tiny_job(
        train__dtype="bf16", deepspeed__zero_stage=stage, deepspeed__micro_batch_size=4,
        deepspeed__overlap_comm=overlap, deepspeed__reduce_bucket_size=BUCKET,
    )  # fmt: skip


def _states(job, **changed):
    ds = deepspeed_config(job, plan_batch(job, 1), "cuda")
    ds["bf16"] |= changed
    return model_state_bytes(parameter_sizes(job.model), ZeroSettings.from_ds_config(ds), 1)


def _backward(engine, job, seed: int) -> torch.Tensor:
    """One micro-batch's backward pass; BF16_Optimizer's fp32 gradient after it."""
    x = torch.randint(0, job.model.vocab_size, (4, job.data.seq_len),
                      generator=torch.Generator().manual_seed(seed))  # fmt: skip
    engine.backward(engine(x, x).loss)
    return torch.cat([t.clone() for t in engine.optimizer.fp32_groups_gradients_flat])


@pytest.mark.slow
@pytest.mark.parametrize("immediate", [True, False], ids=["immediate", "after-backward"])
def test_bf16_optimizer_adds_each_micro_batch_once(home, tiny_job, engine_of, monkeypatch,
                                                   immediate):  # fmt: skip
    """Before: DeepSpeed zeroes the bf16 gradients in a backward prologue it hooks onto the
    model's output tensors, and a ModelOutput dataclass was not searched for them: the
    second micro-batch's fp32 sum got the first one's gradient twice. Right now with
    immediate_grad_update (the job's setting: no bf16 gradient kept) and without it (the
    prologue runs on a ModelOutput). The weights do not change inside a step, so the second
    micro-batch alone, on a fresh engine, is its own gradient."""
    from deepspeed.runtime.bf16_optimizer import BF16_Optimizer

    from scalelab.jobs.training import train

    def configured(*args):
        ds = deepspeed_config(*args)
        ds["bf16"]["immediate_grad_update"] = immediate
        return ds

    monkeypatch.setattr(train, "deepspeed_config", configured)
    job = _job(tiny_job)  # 2 micro-batches of 4 sequences per step
    with engine_of(job) as engine:
        assert isinstance(engine.optimizer, BF16_Optimizer)
        assert engine.optimizer.immediate_grad_update == immediate
        assert (engine.zero_reduce_bucket_size(), engine.zero_overlap_comm()) == (BUCKET, False)
        first = _backward(engine, job, seed=1)
        engine.step()  # not yet the boundary: no update
        both = _backward(engine, job, seed=2)
        kept = [p for p in engine.module.parameters() if p.grad is not None]
        bf16_bytes = sum(p.numel() * p.element_size() for p in engine.module.parameters())
    with engine_of(job) as fresh:
        second = _backward(fresh, job, seed=2)
    assert torch.equal(both, first + second)  # each micro-batch's gradient added once
    if immediate:
        assert not kept  # each bf16 gradient freed once added into the fp32 buffer
        # the planner counts what it frees: every parameter's bf16 gradient
        kept_before = _states(job, immediate_grad_update=False).grads - _states(job).grads
        assert kept_before == bf16_bytes


def test_the_planner_counts_the_reduce_buckets_each_setting_keeps(tiny_job):
    """ZeRO-2 (bf16, fp32 accumulation): b_p x reduce_bucket_size per bucket, two with
    overlap_comm; BF16_Optimizer (ZeRO-1) reduces after backward without buckets."""
    overlapped, one = _states(_job(tiny_job, 2, overlap=True)), _states(_job(tiny_job, 2))
    assert (overlapped.buckets, one.buckets) == (2 * 2 * BUCKET, 2 * BUCKET)  # bf16 gradients
    assert overlapped.grads == one.grads and overlapped.optimizer == one.optimizer
    assert _states(_job(tiny_job, 1)).buckets == 0
    assert _job(tiny_job, 2, overlap=True).trial_id == _job(tiny_job, 2).trial_id  # placement
