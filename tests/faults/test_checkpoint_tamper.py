"""Nothing in a trial folder can make the training job run code: a checkpoint file whose
pickle calls a function is never unpickled, whether or not the tamperer also rewrote the
recorded checksums (issue 17, defect 6)."""

import os

import pytest
import torch

from scalelab.contract.workdir import RESULT_FILE
from scalelab.jobs.training.train import run


class _RunsCode:
    """Unpickling this calls os.system: the classic poisoned checkpoint."""

    def __init__(self, sentinel) -> None:
        self.command = f"touch {sentinel}"

    def __reduce__(self):
        return os.system, (self.command,)


@pytest.mark.slow
@pytest.mark.parametrize(
    "file, re_record",
    [
        ("mp_rank_00_model_states.pt", True),  # read by DeepSpeed
        ("rng_rank0.pt", True),  # read by scalelab
        ("zero_pp_rank_0_mp_rank_00_optim_states.pt", False),
    ],
    ids=["model-states-checksum-rewritten", "rng-checksum-rewritten", "optimizer-states"],
)
def test_a_checkpoint_that_would_run_code_is_not_unpickled(trial_copy, tmp_path, file, re_record):
    trial = trial_copy
    (trial.dir / RESULT_FILE).unlink()
    sentinel = tmp_path / "code-ran"
    poisoned = trial.ckpt / "step00000008" / file
    torch.save({"module": _RunsCode(sentinel)}, poisoned)
    if re_record:
        trial.re_record(poisoned)

    try:
        result = run(trial.job)
    finally:
        assert not sentinel.exists(), "the checkpoint ran code"
    assert result.status == "FINISHED" and result.steps == 8
    assert trial.curve() == trial.losses  # resumed from step 6 instead
    reason = (trial.ckpt / "rejected" / "step00000008" / "REJECTED").read_text()
    assert str(poisoned) in reason


def test_deepspeeds_own_loads_cannot_run_code_while_checkpoints_are_read(tmp_path):
    """DeepSpeed calls torch.load(..., weights_only=False) (its checkpoint engine, ZeRO
    optimizers, universal checkpoints); inside jobs.training.safe_load's scope those calls refuse a
    pickle that calls a function, and still read DeepSpeed's own value classes."""
    from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import TorchCheckpointEngine
    from deepspeed.runtime.zero.config import ZeroStageEnum

    from scalelab.jobs.training.safe_load import weights_only_loading

    sentinel = tmp_path / "code-ran"
    poisoned, honest = tmp_path / "poisoned.pt", tmp_path / "honest.pt"
    torch.save({"module": _RunsCode(sentinel)}, poisoned)
    torch.save({"zero_stage": ZeroStageEnum.gradients, "w": torch.ones(2)}, honest)
    with weights_only_loading():
        with pytest.raises(Exception, match="posix.system|Unsupported global"):
            TorchCheckpointEngine().load(str(poisoned), map_location="cpu")
        assert TorchCheckpointEngine().load(str(honest))["zero_stage"] == ZeroStageEnum.gradients
    assert not sentinel.exists()
    assert "TORCH_FORCE_WEIGHTS_ONLY_LOAD" not in os.environ  # the scope is left as found
