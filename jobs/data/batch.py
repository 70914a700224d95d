"""One batch of model inputs, shared by every data source and the evaluation.

Its arrays are C-contiguous whatever the source made: torch.from_numpy keeps a strided
array's strides, and pinning or copying a strided tensor to a GPU goes through another
temporary (jobs/data/device_inputs.py)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Batch:
    x: np.ndarray  # (B, T) int64 inputs
    y: np.ndarray  # (B, T) int64 targets (-100 = no loss); (B,) class labels
    pad_mask: np.ndarray | None = None  # (B, T) bool, True = real token (classification)

    def __post_init__(self) -> None:
        for name in ("x", "y", "pad_mask"):
            a = getattr(self, name)
            if a is not None and not a.flags.c_contiguous:  # a copy only where needed
                object.__setattr__(self, name, np.ascontiguousarray(a))
