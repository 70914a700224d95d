"""One batch of model inputs, shared by every data source and the evaluation."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Batch:
    x: np.ndarray  # (B, T) int64 inputs
    y: np.ndarray  # (B, T) int64 targets (-100 = no loss); (B,) class labels
    pad_mask: np.ndarray | None = None  # (B, T) bool, True = real token (classification)
