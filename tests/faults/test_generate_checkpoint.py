"""`scalelab generate` on a real finished trial (the session's ZeRO-2 BudgetFormer trial):
it samples; a bad trial, checkpoint or prompt is one line and exit 2; a checkpoint whose
pickle would run code is never unpickled, even with its checksum re-recorded."""

import os
import shutil

import pytest
import torch
from trained_checks import checkpoint_val_loss
from typer.testing import CliRunner

from scalelab.cli.main import app


class _RunsCode:
    def __init__(self, sentinel) -> None:
        self.command = f"touch {sentinel}"

    def __reduce__(self):
        return os.system, (self.command,)


def _generate(*args: str):
    return CliRunner().invoke(app, ["generate", *args])


def _assert_one_error_line(result, expected: str) -> None:
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], lines


def test_generate_samples_from_a_finished_trial(trial_copy):
    trial_id = trial_copy.job.trial_id
    greedy = ["--prompt", "def ", "--max-new-tokens", "12", "--temperature", "0", "-n", "2"]
    result = _generate(trial_id[:6], *greedy)  # a unique prefix names the trial
    assert result.exit_code == 0, result.output
    first, second = result.output.rstrip("\n").split("\n---\n")
    assert first == second and first.startswith("def ") and len(first) > len("def ")
    tag_dir = str(trial_copy.ckpt / "step00000006")  # an older checkpoint, by its folder
    sampled = _generate(tag_dir, "--prompt", "def ", "--seed", "3", "--top-k", "5")
    assert sampled.exit_code == 0 and sampled.output.startswith("def ")
    assert sampled.output == _generate(tag_dir, "--prompt", "def ", "--seed", "3",
                                       "--top-k", "5").output  # fmt: skip
    # the weights generate uses are the trained ones: they give the final validation loss
    final_val = trial_copy.curve("val/loss")[-1][1]
    assert checkpoint_val_loss(trial_copy.job) == pytest.approx(final_val, rel=1e-5)


def test_generate_names_what_is_wrong_in_one_line(trial_copy):
    trial_id = trial_copy.job.trial_id
    _assert_one_error_line(_generate("no-such-trial", "--prompt", "x"), "no trial 'no-such-trial'")
    _assert_one_error_line(_generate(trial_id, "--prompt", ""), "encodes to no tokens")
    long_prompt = ["--prompt", "x" * 30, "--max-new-tokens", "4"]  # 30 + 4 - 1 > 32
    _assert_one_error_line(_generate(trial_id, *long_prompt), "does not fit the model's context")
    too_long = _generate(trial_id, "--prompt", "x" * 33)  # no room for even one token
    _assert_one_error_line(too_long, "at most 32 prompt tokens for 1 new token(s)")
    fits = _generate(trial_id, "--prompt", "x" * 32, "--temperature", "0")  # exactly fits
    assert fits.exit_code == 0 and fits.output.startswith("x" * 32)
    (trial_copy.dir / "job.json").write_text('{"model": {"size": "nano"}}')
    _assert_one_error_line(_generate(str(trial_copy.dir), "--prompt", "x"), "job.json: train:")


def test_a_trial_without_checkpoints_is_refused(trial_copy):
    shutil.rmtree(trial_copy.ckpt)
    result = _generate(trial_copy.job.trial_id, "--prompt", "x")
    _assert_one_error_line(result, "has no complete checkpoint")


@pytest.mark.parametrize("re_record", [True, False], ids=["checksum-rewritten", "as-is"])
def test_a_checkpoint_that_would_run_code_is_not_unpickled(trial_copy, tmp_path, re_record):
    sentinel = tmp_path / "code-ran"
    poisoned = trial_copy.ckpt / "step00000008" / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    torch.save({"optimizer_state_dict": _RunsCode(sentinel)}, poisoned)
    if re_record:
        trial_copy.re_record(poisoned)
    result = _generate(trial_copy.job.trial_id, "--prompt", "x")
    expected = "would call posix.system" if re_record else "were written"
    _assert_one_error_line(result, expected)
    assert not sentinel.exists()


def test_a_config_that_does_not_describe_its_checkpoint_is_refused_before_building(
    trial_copy, monkeypatch
):
    """Issue 33, item 10: a job.json tampered to 124M built the 124M model (70 s) before the
    checkpoint's nano weights were found not to fit. The shapes are compared on the meta
    device first: no model is built."""
    import json

    from scalelab.models import build as build_module

    job = json.loads((trial_copy.dir / "job.json").read_text())
    job["model"] |= {"size": "124M", "n_layer": 12, "d_model": 768, "n_head": 12}
    (trial_copy.dir / "job.json").write_text(json.dumps(job))
    built = []
    real_build = build_module.build

    def build(cfg, device=None):
        built.append(str(device))
        return real_build(cfg, device)

    monkeypatch.setattr(build_module, "build", build)
    result = _generate(str(trial_copy.dir), "--prompt", "x")
    _assert_one_error_line(result, "does not fit the model of job.json")
    assert built == ["meta"], built  # shapes only, never the 124M model itself
