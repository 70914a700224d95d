"""The checkpoint round trip of the training part (training.py): the trained engine saved as
the job saves it (jobs/training/checkpoint.py), a fresh engine resumed from the checkpoint;
its parameters and optimizer state must equal the saved ones, bit for bit."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.acceptance.checks import MEMORY_REL, Check, verdict, within
from scalelab.jobs.training import checkpoint
from scalelab.jobs.training.train import _Trainer


def engine_state(engine: Any) -> dict[str, Any]:
    """The module's parameters and the optimizer's state, flattened to path -> value, on
    the host (what a resume must restore)."""
    flat: dict[str, Any] = {}

    def walk(obj: Any, path: str) -> None:
        if isinstance(obj, torch.Tensor):
            flat[path] = obj.detach().to("cpu", copy=True)
        elif isinstance(obj, dict):
            for k, v in obj.items():
                walk(v, f"{path}.{k}")
        elif isinstance(obj, (list, tuple)):
            for i, v in enumerate(obj):
                walk(v, f"{path}[{i}]")
        elif isinstance(obj, (int, float, str, bool)) or obj is None:
            flat[path] = obj

    walk(engine.module.state_dict(), "module")
    walk(engine.optimizer.state_dict(), "optimizer")
    return flat


def differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """Paths whose values differ (tensors bit for bit, dtype and shape included)."""
    found = sorted(set(a) ^ set(b))
    for path in sorted(set(a) & set(b)):
        x, y = a[path], b[path]
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            same = x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y)
        else:
            same = type(x) is type(y) and x == y
        if not same:
            found.append(path)
    return found


def checkpoint_round_trip(trainer: _Trainer, folder: Path, estimate: int) -> Check:
    """Save the trained engine as the job does, build a fresh engine (initial weights) and
    resume it from the checkpoint; time both and compare their states."""
    env = trainer.env
    sync = torch.cuda.synchronize if env.device.startswith("cuda") else (lambda: None)
    goal = (
        "a fresh engine resumed from the saved checkpoint holds bit-identical parameters and "
        f"optimizer state; files within {MEMORY_REL:.0%} of the planner's checkpoint size; "
        "save and load seconds and GB/s reported"
    )
    saved = engine_state(trainer.engine)
    sync()
    t0 = time.perf_counter()
    tag = checkpoint.save(trainer.engine, env, folder, {"step": 1}, keep=1)
    sync()
    save_s = time.perf_counter() - t0
    nbytes = sum(p.stat().st_size for p in tag.iterdir() if p.is_file())
    trainer._build_engine()  # initial weights, fresh optimizer
    # the load must change the weights (a fresh optimizer differs anyway: no moments yet)
    untrained = [p for p in differences(engine_state(trainer.engine), saved) if "module." in p]
    sync()
    t0 = time.perf_counter()
    resumed = checkpoint.resume(trainer.engine, env, folder)
    sync()
    load_s = time.perf_counter() - t0
    diff = differences(engine_state(trainer.engine), saved)
    ok = resumed.state is not None and not diff and bool(untrained)
    ok = ok and within(nbytes, estimate, MEMORY_REL)
    gb = nbytes / 1e9
    measured = (
        f"{gb:.3f} GB (plan {estimate / 1e9:.3f}): save {save_s:.2f} s ({gb / save_s:.2f} GB/s), "
        f"verify + load {load_s:.2f} s ({gb / load_s:.2f} GB/s); "
        + (f"{len(diff)} differ, e.g. {diff[0]}" if diff else f"{len(saved)} tensors/values equal")
        + ("" if untrained else "; the fresh engine's weights already equalled the saved ones")
        + ("" if resumed.state is not None else f"; not resumed: {resumed.skipped}")
    )
    return Check("checkpoint save and load", goal, verdict(ok), measured)
