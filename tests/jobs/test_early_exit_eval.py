"""The training job's end-of-run early-exit baseline (train.early_exit_alphas) and the
inference-mode TSA metrics of validation, through the real jobs.training.train.run."""

import json

import pytest

from scalelab.contract.workdir import RESULT_FILE
from scalelab.jobs.training.train import run


@pytest.mark.parametrize("alphas", [[0.0], [1.5], [0.5, 0.5]])
def test_bad_alphas_are_config_errors(tiny_job, alphas):
    with pytest.raises(ValueError, match="early_exit_alphas"):
        tiny_job(train__early_exit_alphas=alphas)


def test_early_exit_needs_a_language_model(tiny_job):
    with pytest.raises(ValueError, match="model.task='lm'"):
        tiny_job(
            model__task="classify", model__n_classes=2, data__source="builtin:classification",
            train__early_exit_alphas=[0.5],
        )  # fmt: skip


def test_early_exit_metrics_at_matched_alpha(home, tiny_job, curve):
    # val set = one batch of 8 x 32 tokens, so the calibration batch is the validation set
    job = tiny_job(train__early_exit_alphas=[0.5, 1.0])
    result = run(job)
    assert result.status == "FINISHED"
    saved = json.loads((home / "trials" / job.trial_id / RESULT_FILE).read_text())
    m = saved["final_metrics"]
    assert m == result.final_metrics
    # nano: 2 blocks, 1 routed; alpha is the share of its 256 token slots that ran
    assert m["early_exit/alpha_a0.5"] == pytest.approx(0.5, abs=0.02)
    assert m["early_exit/tlops_saved_a0.5"] == pytest.approx(
        1 - (1 + m["early_exit/alpha_a0.5"]) / 2
    )
    assert 0 < m["early_exit/threshold_a0.5"] < 1
    # alpha = 1: nobody exits, so the loss is the model's own validation loss
    assert m["early_exit/alpha_a1"] == 1.0
    assert m["early_exit/val_loss_a1"] == pytest.approx(result.final_val_loss, rel=1e-5)
    assert m["early_exit/val_loss_a0.5"] != pytest.approx(result.final_val_loss, rel=1e-4)
    logged = curve(home, job.trial_id, "early_exit/val_loss_a0.5")
    assert logged == [(result.steps, m["early_exit/val_loss_a0.5"])]


def test_tsa_on_the_copy_task_logs_inference_alpha(home, tiny_job, curve):
    """builtin:copy through the job: loss only on the answer half, TSA's executed alpha."""
    job = tiny_job(
        model__vocab_size=32, model__block_size=20, model__tsa={"lambda_depth": 0.01},
        data__source="builtin:copy", data__seq_len=20, data__val_tokens=640,
        train__global_batch_tokens=640, train__tokens=640 * 8,
    )  # fmt: skip
    result = run(job)
    assert result.status == "FINISHED"
    # a uniform guess over the 31 answer symbols costs ln 31 = 3.43 nats; trained < that
    assert 0 < result.final_val_loss < 3.43
    (_, alpha), *_ = curve(home, job.trial_id, "tsa/val_alpha")[-1:]
    # sparse inference executes whole token-layers: 32 seqs x 20 tokens, one routed block
    assert 0 <= alpha <= 1 and (alpha * 640) == pytest.approx(round(alpha * 640), abs=1e-3)
    (_, saved), *_ = curve(home, job.trial_id, "tsa/val_tlops_saved")[-1:]
    assert saved == pytest.approx(1 - (1 + alpha) / 2)


def test_soft_tsa_validation_also_reports_its_binary_gates(home, tiny_job, curve):
    """sparse_inference false: val/loss and tsa/val_alpha are the soft values the paper
    reports; the end of training adds the binary gates' loss and executed α beside them."""
    soft = tiny_job(model__tsa={"lambda_depth": 0.01, "sparse_inference": False})
    result = run(soft)
    assert result.status == "FINISHED"
    m = result.final_metrics
    (_, soft_alpha), *_ = curve(home, soft.trial_id, "tsa/val_alpha")[-1:]
    # binary: whole token-layers run or not (one routed block, 8 x 32 tokens); soft: 1 - p
    tokens = 8 * 32
    binary_alpha = m["tsa/val_alpha_binary"]
    assert binary_alpha * tokens == pytest.approx(round(binary_alpha * tokens), abs=1e-3)
    assert soft_alpha * tokens != pytest.approx(round(soft_alpha * tokens), abs=1e-3)
    assert m["tsa/val_loss_binary"] != pytest.approx(result.final_val_loss, rel=1e-4)
    assert curve(home, soft.trial_id, "tsa/val_loss_binary") == [
        (result.steps, m["tsa/val_loss_binary"])
    ]
    # the same model validated with binary gates from the start: nothing to add
    binary = tiny_job(model__tsa={"lambda_depth": 0.02})
    assert run(binary).final_metrics == {}
