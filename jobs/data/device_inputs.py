"""Batches onto the device without stalling it: pinned host memory, non-blocking copies,
and the next micro-batch read and sent while the current one computes.

A copy from ordinary (pageable) host memory makes the host wait until the GPU has run
everything queued before it; from pinned memory it is queued like a kernel and the host
runs on. The copies use the compute stream: a micro-batch of token ids is a few hundred KB,
so what matters is that they never block the host, not that they overlap the kernels.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch

from scalelab.jobs.data.batch import Batch

Inputs = tuple[torch.Tensor, torch.Tensor, dict[str, Any]]


def _to(array: Any, device: str) -> torch.Tensor:
    t = torch.from_numpy(array)
    if device.startswith("cuda"):
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def model_inputs(b: Batch, device: str) -> Inputs:
    """(x, y, keyword arguments) of a batch on `device`; pad_mask only when the batch has one."""
    kw = {} if b.pad_mask is None else {"pad_mask": _to(b.pad_mask, device)}
    return _to(b.x, device), _to(b.y, device), kw


def prefetched(batches: Iterable[Batch], device: str) -> Iterator[Inputs]:
    """The batches' inputs on `device`, each sent before the previous one is handed out."""
    ahead: Inputs | None = None
    for b in batches:
        staged = model_inputs(b, device)
        if ahead is not None:
            yield ahead
        ahead = staged
    if ahead is not None:
        yield ahead
