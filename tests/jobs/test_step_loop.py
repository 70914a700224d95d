"""The step loop's speed defaults on CPU: no host read between log points, the next
micro-batch sent ahead, the fused AdamW kernel under DeepSpeed, torch.compile opt-in."""

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import scalelab.jobs as jobs
from scalelab.jobs.data.batch import Batch
from scalelab.jobs.data.device_inputs import prefetched
from scalelab.jobs.training.train import run

PROJECT = Path(jobs.__file__).resolve().parents[1]
OURS = (str(PROJECT / "jobs"), str(PROJECT / "models"))
BUILD = "models/build.py"
HOST_READS = ("item", "cpu", "tolist", "numpy", "__float__", "__int__", "__bool__")


@pytest.mark.slow
def test_the_step_loop_reads_the_device_only_at_log_steps(home, tiny_job, monkeypatch):
    """Every host read of a tensor made by the project's own code (not DeepSpeed's), with
    the number of optimizer steps done when it happened: with log_interval 4 over 8 steps,
    only the reductions before the updates of steps 4 and 8, the look at step 1's loss for
    its progress line (the others are a time interval apart) and the final evaluation and
    checkpoint read anything."""
    from deepspeed.runtime.engine import DeepSpeedEngine

    done, reads = [0], []
    step = DeepSpeedEngine.step

    def counted_step(self, *args, **kwargs):
        boundary = self.is_gradient_accumulation_boundary()  # this call updates the weights
        out = step(self, *args, **kwargs)
        done[0] += boundary
        return out

    monkeypatch.setattr(DeepSpeedEngine, "step", counted_step)

    def spy(name):
        original = getattr(torch.Tensor, name)

        def read(self, *args, **kwargs):
            caller = sys._getframe(1).f_code
            # models/build.py checks parameters it drew on the host before the engine exists
            if caller.co_filename.startswith(OURS) and not caller.co_filename.endswith(BUILD):
                reads.append((done[0], name, f"{Path(caller.co_filename).name}:{caller.co_name}"))
            return original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, read)

    for name in HOST_READS:
        spy(name)
    job = tiny_job(train__log_interval=4, train__eval_interval=1000, deepspeed__micro_batch_size=4,
                   train__progress_interval_s=1e6)  # fmt: skip
    result = run(job)  # 8 steps of 2 micro-batches
    assert result.status == "FINISHED" and result.steps == 8
    assert {n for n, _, _ in reads} <= {0, 3, 7, 8}, sorted(set(reads))
    assert {n for n, _, _ in reads} >= {0, 3, 7}  # the reductions themselves


def test_the_next_micro_batch_is_sent_before_the_current_one_is_handed_out():
    sent = []

    def batches():
        for i in range(3):
            sent.append(i)
            yield Batch(np.full((1, 4), i), np.full((1, 4), i))

    handed = []
    for x, _, _ in prefetched(batches(), "cpu"):
        handed.append(int(x[0, 0]))
        assert sent[-1] == min(handed[-1] + 1, 2)  # one ahead (the last has none after it)
    assert handed == [0, 1, 2]


@pytest.mark.parametrize(("stage", "dtype"), [(0, "fp32"), (2, "bf16")])
def test_deepspeed_runs_the_fused_adamw_kernel(stage, dtype, home, tiny_job, monkeypatch,
                                               engine_of):  # fmt: skip
    calls = []
    fused = torch._fused_adamw_
    monkeypatch.setattr(torch, "_fused_adamw_", lambda *a, **k: calls.append(1) or fused(*a, **k))
    job = tiny_job(deepspeed__zero_stage=stage, train__dtype=dtype)
    with engine_of(job) as engine:
        before = [p.detach().float().clone() for p in engine.module.parameters()]
        x = torch.randint(0, job.model.vocab_size, (8, job.data.seq_len))
        engine.backward(engine(x, x).loss)
        engine.step()
        after = list(engine.module.parameters())
    assert calls  # the optimizer step went through the fused kernel ...
    assert any(not torch.equal(a.float(), b) for a, b in zip(after, before, strict=True))


@pytest.mark.slow
def test_compile_is_opt_in_and_keeps_the_losses(home, tiny_job, curve, tmp_path, monkeypatch):
    """train.compile goes through engine.compile(), here of a Hadamard model (its transform
    is a custom op Dynamo does not trace into); the graph is captured with aot_eager
    (Dynamo + AOT autograd, no code generation): inductor's C++ build of even the nano
    model took 440 s on this shared 2-core machine (tests/models/test_compile.py compiles
    every variant, and the Hadamard model with inductor, at a tinier size)."""
    from deepspeed.runtime.engine import DeepSpeedEngine

    job = tiny_job(train__tokens=256 * 2, model__hadamard={})
    run(job)
    compiled = job.model_copy(update={"train": job.train.model_copy(update={"compile": True})})
    assert compiled.trial_id == job.trial_id  # execution, not science
    monkeypatch.setenv("SCALELAB_HOME", str(tmp_path / "compiled"))
    compile_, used = DeepSpeedEngine.compile, []

    def aot_eager(engine, *args, **kwargs):
        used.append(engine)
        return compile_(engine, backend="aot_eager")

    monkeypatch.setattr(DeepSpeedEngine, "compile", aot_eager)
    run(compiled)
    assert used and used[0].is_compiled
    eager = [v for _, v in curve(home, job.trial_id, "train/loss")]
    fast = [v for _, v in curve(tmp_path / "compiled", job.trial_id, "train/loss")]
    assert fast == pytest.approx(eager, rel=1e-4)
