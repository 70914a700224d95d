"""Batches onto the device without stalling it: read on a background thread one step
ahead, pinned host memory, non-blocking copies, and the next micro-batch sent while the
current one computes.

A background thread reads the micro-batches (memory-mapped shards, the keyed permutation,
the widening to int64) and, for a GPU, copies them into pinned host memory, while the
training thread runs the step; it keeps up to `ahead` micro-batches ready (default: one
optimizer step's worth). It reads the same iterator in the same order, so the batches are
the same with or without it, and nothing of it is saved in a checkpoint: the sample order
is a function of (data, seed, step) (jobs/data/reader.py), so a resumed run starts a new
thread at its step.

A copy from ordinary (pageable) host memory makes the host wait until the GPU has run
everything queued before it; from pinned memory it is queued like a kernel and the host
runs on. The copies use the compute stream: a micro-batch of token ids is a few hundred KB,
so what matters is that they never block the host, not that they overlap the kernels.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import torch

from scalelab.jobs.data.batch import Batch

Inputs = tuple[torch.Tensor, torch.Tensor, dict[str, Any]]
HostInputs = tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]  # x, y, pad_mask
_END = object()


def _host(array: np.ndarray, pin: bool) -> torch.Tensor:
    t = torch.from_numpy(np.ascontiguousarray(array))
    return t.pin_memory() if pin else t


def host_inputs(b: Batch, pin: bool) -> HostInputs:
    """A batch's arrays as host tensors: contiguous, and in pinned memory when `pin`."""
    mask = None if b.pad_mask is None else _host(b.pad_mask, pin)
    return _host(b.x, pin), _host(b.y, pin), mask


def _to(t: torch.Tensor, device: str) -> torch.Tensor:
    if device.startswith("cuda"):
        if not t.is_pinned():
            t = t.pin_memory()
        return t.to(device, non_blocking=True)
    return t.to(device)


def _on_device(h: HostInputs, device: str) -> Inputs:
    x, y, mask = h
    kw = {} if mask is None else {"pad_mask": _to(mask, device)}
    return _to(x, device), _to(y, device), kw


def model_inputs(b: Batch, device: str) -> Inputs:
    """(x, y, keyword arguments) of a batch on `device`; pad_mask only when the batch has one."""
    return _on_device(host_inputs(b, pin=device.startswith("cuda")), device)


def read_ahead(batches: Iterable[Batch], pin: bool, ahead: int) -> Iterator[HostInputs]:
    """`batches` as host tensors, read on a background thread up to `ahead` batches before
    they are asked for; the same sequence as reading them here. An error in the reading is
    raised here, at the batch it stopped at. Closing the iterator (or dropping it) stops the
    thread."""
    ready: queue.Queue = queue.Queue(maxsize=max(1, ahead))
    stop = threading.Event()

    def put(item: Any) -> bool:
        while not stop.is_set():
            try:
                ready.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for b in batches:
                if not put(host_inputs(b, pin)):
                    return
            put(_END)
        except BaseException as e:  # noqa: BLE001 - handed to the training thread, raised there
            put(e)

    thread = threading.Thread(target=produce, name="scalelab-batches", daemon=True)
    thread.start()
    try:
        while (item := ready.get()) is not _END:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        thread.join(timeout=5.0)


def prefetched(batches: Iterable[Batch], device: str, ahead: int = 0) -> Iterator[Inputs]:
    """The batches' inputs on `device`, each sent before the previous one is handed out;
    with `ahead` > 0, read (and pinned, for a GPU) on a background thread up to `ahead`
    batches before they are needed (read_ahead)."""
    pin = device.startswith("cuda")
    if ahead > 0:
        hosts: Iterable[HostInputs] = read_ahead(batches, pin, ahead)
    else:
        hosts = (host_inputs(b, pin) for b in batches)
    staged: Inputs | None = None
    try:
        for h in hosts:
            sent = _on_device(h, device)
            if staged is not None:
                yield staged
            staged = sent
        if staged is not None:
            yield staged
    finally:
        if isinstance(hosts, Iterator):
            hosts.close()  # stops read_ahead's thread when the loop ends early
