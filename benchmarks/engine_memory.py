"""What a DeepSpeed engine holds: every tensor storage reachable from it, each counted once
(shared by tests/orchestrator/test_memory_engines.py's worker and the acceptance check's
training steps, which compare it with orchestrator/plan/memory.py)."""

from __future__ import annotations

import torch

OWNERS = ("deepspeed", "torch", "jobs", "models")  # objects whose attributes are followed
BUCKET = ".ipg_"  # DeepSpeed's gradient buckets (ZeRO-1/2 free theirs after each backward)


def storages(root: object) -> dict[int, tuple[int, str]]:
    """data_ptr -> (bytes, path of the first reference found) of every reachable storage."""
    seen: set[int] = set()
    found: dict[int, tuple[int, str]] = {}
    stack: list[tuple[object, str]] = [(root, "engine")]
    while stack:
        obj, path = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            storage = obj.untyped_storage()
            if storage.data_ptr() and storage.data_ptr() not in found:
                found[storage.data_ptr()] = (storage.nbytes(), path)
            if obj.is_leaf and obj.grad is not None:
                stack.append((obj.grad, path + ".grad"))
            stack.extend((v, f"{path}.{k}") for k, v in vars(obj).items())  # ZeRO-3's ds_tensor
        elif isinstance(obj, dict):
            stack.extend((v, f"{path}[{i}]") for i, v in enumerate(obj.values()))
            stack.extend((k, f"{path}[key]") for k in obj if torch.is_tensor(k))
        elif isinstance(obj, (list, tuple, set)):
            stack.extend((v, f"{path}[{i}]") for i, v in enumerate(obj))
        elif type(obj).__module__.split(".")[0] in OWNERS and hasattr(obj, "__dict__"):
            stack.extend((v, f"{path}.{k}") for k, v in vars(obj).items())
    return found


def held_bytes(engine: object) -> tuple[int, int]:
    """(model states, gradient buckets) in bytes: what `engine` holds right now."""
    held = storages(engine).values()
    buckets = sum(b for b, path in held if BUCKET in path)
    return sum(b for b, _ in held) - buckets, buckets
