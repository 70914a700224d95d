"""A trained trial's model, outside training: find its checkpoint, verify it, and build the
model with the checkpoint's consolidated weights (for `scalelab generate`).

The weights come from whichever form the trial's ZeRO stage saved: with ZeRO 1-3 the fp32
master weights, merged from every rank's optimizer shard by DeepSpeed's zero_to_fp32 (the
only complete copy at stage 3, the exact one under bf16 / fp16 at stages 1-2); at stage 0
the module's own weights in `mp_rank_00_model_states.pt` (in the training dtype, which is
the precision an fp32 or bf16 stage-0 run holds them in). Before anything is unpickled the
files are compared with their recorded checksums and scanned for pickles that would call
a function (jobs.training.checkpoint.verify), and every torch.load runs weights-only
(jobs.training.safe_load): nothing in a trial folder can make this run code.
"""

from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass
from pathlib import Path

import torch
from pydantic import ValidationError

from scalelab.contract.workdir import JOB_FILE, scalelab_home
from scalelab.jobs.config import JobConfig
from scalelab.jobs.training import checkpoint, safe_load


class TrialError(ValueError):
    """A trial or checkpoint that cannot be used, with the one-line reason."""


@dataclass(frozen=True)
class Located:
    trial_dir: Path
    tag_dir: Path  # the checkpoint folder (trials/<id>/ckpt/step<N>)
    job: JobConfig


MAX_NAME = 255  # a file name's length limit: no trial id or folder name is longer


def locate(target: str) -> Located:
    """A trial id (or a unique prefix) under $SCALELAB_HOME/trials, a trial folder, or one
    checkpoint folder of a trial (trials/<id>/ckpt/step<N>); a trial means its newest
    complete checkpoint."""
    path = Path(target).expanduser()
    tag_dir = None
    if _is_file(path / checkpoint.MARKER):
        tag_dir, trial_dir = path, path.parent.parent
    elif _is_file(path / JOB_FILE):
        trial_dir = path
    else:
        trial_dir = _trial_by_id(target)
    job = _read_job(trial_dir / JOB_FILE)
    if tag_dir is None:
        tag_dir = checkpoint.latest(trial_dir / "ckpt")
        if tag_dir is None:
            raise TrialError(
                f"trial {trial_dir.name} has no complete checkpoint in {trial_dir / 'ckpt'} "
                "(it saves one every train.checkpoint_interval steps and at the end)"
            )
    return Located(trial_dir, tag_dir, job)


def _is_file(path: Path) -> bool:
    """A file there; False also where the path cannot be a file (a name too long, ...)."""
    try:
        return path.is_file()
    except OSError:
        return False


def _trial_by_id(selector: str) -> Path:
    trials = scalelab_home() / "trials"
    if "/" in selector or not selector or len(selector) > MAX_NAME:
        shown = selector if len(selector) <= 80 else selector[:80] + "..."
        raise TrialError(
            f"{shown}: not a trial id, trial folder (no {JOB_FILE}) or checkpoint folder"
        )
    found = sorted(p for p in trials.glob(f"{selector}*") if (p / JOB_FILE).is_file())
    exact = [p for p in found if p.name == selector]
    if exact or len(found) == 1:
        return (exact or found)[0]
    if not found:
        raise TrialError(f"no trial {selector!r} under {trials} (a trial id, or a folder)")
    names = ", ".join(p.name for p in found[:5]) + (", ..." if len(found) > 5 else "")
    raise TrialError(f"{selector!r} matches {len(found)} trials under {trials}: {names}")


def _read_job(path: Path) -> JobConfig:
    try:
        return JobConfig.model_validate_json(path.read_bytes())
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "<root>"
        raise TrialError(f"{path}: {where}: {first['msg']}") from None
    except OSError as e:
        raise TrialError(f"{path} is unreadable: {e.strerror}") from None


def consolidated_weights(tag_dir: Path, zero_stage: int) -> dict[str, torch.Tensor]:
    """The model's full state dict from checkpoint folder `tag_dir` (module docstring)."""
    problem = checkpoint.verify(tag_dir)
    if problem:
        raise TrialError(f"checkpoint {tag_dir} is not usable: {problem}")
    with safe_load.weights_only_loading():
        try:
            if zero_stage == 0:
                states = torch.load(tag_dir / "mp_rank_00_model_states.pt", map_location="cpu")
                return states["module"]
            from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

            progress = io.StringIO()  # it prints and draws progress bars
            with contextlib.redirect_stdout(progress), contextlib.redirect_stderr(progress):
                return get_fp32_state_dict_from_zero_checkpoint(
                    str(tag_dir.parent), tag=tag_dir.name
                )
        except Exception as e:
            first = (str(e).strip().splitlines() or [""])[0][:500]
            raise TrialError(
                f"checkpoint {tag_dir} could not be read: {type(e).__name__}: {first}"
            ) from None


def load_model(located: Located, device: str = "cpu") -> torch.nn.Module:
    """The trial's model in eval mode, fp32, with the checkpoint's weights. The checkpoint
    is verified and read, and its tensors' shapes checked against the config's model built
    on the meta device (no memory, no time), before the model is built: a job.json that does
    not describe its checkpoint is refused at once, not after building a large model."""
    from scalelab.models.build import build

    weights = consolidated_weights(located.tag_dir, located.job.deepspeed.zero_stage)
    shapes = {k: tuple(v.shape) for k, v in build(located.job.model, "meta").state_dict().items()}
    found = {k: tuple(v.shape) for k, v in weights.items()}
    if found != shapes:
        wrong = sorted(set(found) ^ set(shapes)) or [k for k in shapes if shapes[k] != found[k]]
        raise TrialError(
            f"checkpoint {located.tag_dir} does not fit the model of {JOB_FILE}: "
            f"{len(wrong)} tensor(s) differ, first {wrong[0]!r} "
            f"(checkpoint {found.get(wrong[0])}, config {shapes.get(wrong[0])})"
        )
    model = build(located.job.model)
    try:
        model.load_state_dict(weights, strict=True)
    except RuntimeError as e:
        first = str(e).strip().splitlines()[0]
        raise TrialError(
            f"checkpoint {located.tag_dir} does not fit the model of {JOB_FILE}: {first}"
        ) from None
    return model.float().to(device).eval()
