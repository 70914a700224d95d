"""The process's random-number states (torch, CUDA, numpy, Python) as tensors and plain
values, so a checkpoint stores them in a form `torch.load(weights_only=True)` reads back
without unpickling any object (numpy's and Python's own state objects would need it)."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def capture() -> dict[str, Any]:
    kind, keys, pos, has_gauss, cached_gaussian = np.random.get_state(legacy=True)
    version, words, gauss_next = random.getstate()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy": {
            "kind": kind,
            "keys": torch.from_numpy(keys.astype(np.int64)),  # uint32 words, exactly
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached_gaussian),
        },
        "python": {
            "version": version,
            "words": torch.tensor(words, dtype=torch.int64),  # 624 uint32 words + index
            "gauss_next": gauss_next,
        },
    }


def restore(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    n = state["numpy"]
    np.random.set_state(
        (n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"],
         n["cached_gaussian"])
    )  # fmt: skip
    p = state["python"]
    random.setstate((p["version"], tuple(p["words"].tolist()), p["gauss_next"]))
