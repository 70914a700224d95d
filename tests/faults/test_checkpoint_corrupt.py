"""A damaged checkpoint is found before it is loaded, named, set aside for good, and the
trial resumes from the newest intact one (issue 17, defect 3)."""

import shutil

import pytest
from mlflow.tracking import MlflowClient
from two_ranks import train_on_two_ranks

from scalelab.contract.workdir import RESULT_FILE, tracking_uri
from scalelab.jobs.training.train import run

MODEL_STATES = "mp_rank_00_model_states.pt"
OPTIMIZER_STATES = "zero_pp_rank_0_mp_rank_00_optim_states.pt"


def _killed_after_step_7(trial) -> None:
    """As if the run had died before its last checkpoint: the newest one is step 6."""
    shutil.rmtree(trial.ckpt / "step00000008")
    (trial.dir / RESULT_FILE).unlink()


def _truncate(path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _flip_a_byte(path) -> None:  # same size, so only a checksum can tell
    data = bytearray(path.read_bytes())
    data[len(data) * 3 // 4] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.slow
@pytest.mark.parametrize(
    "damage, file",
    [(_truncate, MODEL_STATES), (_flip_a_byte, OPTIMIZER_STATES)],
    ids=["truncated-model-states", "flipped-byte-in-optimizer-states"],
)
def test_a_damaged_newest_checkpoint_is_set_aside_and_the_older_one_resumed(
    trial_copy, damage, file, caplog
):
    trial = trial_copy
    _killed_after_step_7(trial)
    bad = trial.ckpt / "step00000006" / file
    damage(bad)

    result = run(trial.job)

    assert result.status == "FINISHED" and result.steps == 8
    assert trial.curve() == trial.losses  # resumed from step 3, bit for bit
    rejected = trial.ckpt / "rejected" / "step00000006"
    assert (rejected / file).exists()  # kept for inspection (step 6 was saved anew)
    assert str(bad) in (rejected / "REJECTED").read_text()  # names the file
    assert any(str(bad) in r.getMessage() for r in caplog.records)  # and says so in the log
    tags = MlflowClient(tracking_uri()).get_run(result.run_id).data.tags
    assert file in tags["scalelab.checkpoints_skipped"]

    again = run(trial.job)  # a later attempt does not try the bad checkpoint again
    assert again.status == "FINISHED" and again.steps == 8
    assert sorted(p.name for p in (trial.ckpt / "rejected").iterdir()) == ["step00000006"]


@pytest.mark.slow
def test_when_no_checkpoint_loads_the_trial_restarts_from_fresh_weights(trial_copy):
    """Every checkpoint's optimizer file is well-formed but not DeepSpeed's (and re-recorded
    in the marker, so only loading can tell): the model weights load, then the optimizer
    fails. The trial must start again from the initial weights, not from a half-loaded
    engine."""
    import torch

    trial = trial_copy
    (trial.dir / RESULT_FILE).unlink()
    for tag_dir in sorted(trial.ckpt.glob("step*")):
        path = tag_dir / OPTIMIZER_STATES
        torch.save({"optimizer_state_dict": {"not": torch.zeros(2)}}, path)
        trial.re_record(path)

    result = run(trial.job)

    assert result.status == "FINISHED" and result.steps == 8
    assert trial.curve() == trial.losses  # from step 0 with the seed's weights
    assert sorted(p.name for p in (trial.ckpt / "rejected").iterdir()) == [
        "step00000003", "step00000006", "step00000008"
    ]  # fmt: skip
    for tag_dir in (trial.ckpt / "rejected").iterdir():
        assert "loading it failed" in (tag_dir / "REJECTED").read_text()


@pytest.mark.slow
@pytest.mark.distributed
def test_two_ranks_agree_to_skip_a_file_only_one_of_them_checked(trial_copy, tmp_path):
    """The ranks split the checksum work; rank 1 checks the damaged RNG file here, and both
    ranks must set the checkpoint aside and load the same older one (through a universal
    checkpoint: the trial was written by 1 rank)."""
    trial = trial_copy
    _killed_after_step_7(trial)
    bad = trial.ckpt / "step00000006" / "rng_rank0.pt"  # rank 1 hashes it with the model file
    _flip_a_byte(bad)
    [result] = train_on_two_ranks([(trial.home, trial.job)], tmp_path)
    assert result["status"] == "FINISHED" and result["steps"] == 8
    assert str(bad) in (trial.ckpt / "rejected" / "step00000006" / "REJECTED").read_text()
    assert [s for s, _ in trial.curve()] == list(range(1, 9))
    assert trial.curve()[:3] == trial.losses[:3]  # before the checkpoint loaded: untouched
