"""Loading checkpoint files without letting them run code.

A torch checkpoint is a pickle, and unpickling with `weights_only=False` lets a file call
any function (a tampered trial folder would run code as the training job). DeepSpeed passes
`weights_only=False` to every `torch.load` it makes (engine, ZeRO optimizers, universal
checkpoints, `ds_to_universal`), so the switch cannot be made at its call sites. Inside
`weights_only_loading()` torch's own override `TORCH_FORCE_WEIGHTS_ONLY_LOAD` makes every
`torch.load` of this process use the restricted unpickler, which builds only tensors,
containers, numbers and strings, plus the few plain DeepSpeed value classes its
checkpoints hold (listed below: an enum, a dataclass of two ints, the loss-scaler state).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from scalelab.jobs.environ import scoped_environ

FORCE, FORBID = "TORCH_FORCE_WEIGHTS_ONLY_LOAD", "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"


def deepspeed_value_classes() -> list[type]:
    """Classes pickled inside DeepSpeed's checkpoints (found with
    torch.serialization.get_unsafe_globals_in_checkpoint on ZeRO 0-3, fp32 and bf16, native
    and universal). None of them runs code when built from a pickle: the unpickler only
    calls the enum with a value or sets plain attributes."""
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    return [ZeroStageEnum, LossScaler, DynamicLossScaler, fragment_address]


@contextmanager
def weights_only_loading() -> Iterator[None]:
    """Every torch.load in this process, DeepSpeed's included, refuses to run code."""
    with scoped_environ({FORCE: "1"}, restore=(FORBID,)):
        os.environ.pop(FORBID, None)  # a user's global opt-out does not reach checkpoints
        with torch.serialization.safe_globals(deepspeed_value_classes()):
            yield


def refused_globals(path: Path) -> list[str]:
    """The functions and classes `path`'s pickle names that a weights-only load refuses,
    found by reading the pickle's opcodes, never by running them (so a check can name the
    file before anything loads it). Raises ValueError if `path` is not a torch.save zip."""
    with torch.serialization.safe_globals(deepspeed_value_classes()):
        return sorted(torch.serialization.get_unsafe_globals_in_checkpoint(path))
