"""DeepSpeed checkpoints in trials/<trial_id>/ckpt/<tag>/, found by a marker written last.

Every rank saves its shard through `engine.save_checkpoint` and its own RNG states; after a
barrier rank 0 writes `<tag>/COMPLETE` (the loop state: step, data position, tokens, the
MLflow run id). Only tags with that marker are ever loaded, so a checkpoint cut short by a
kill is ignored. The newest `keep` complete checkpoints are kept.
"""

from __future__ import annotations

import json
import random
import shutil
import signal
from pathlib import Path
from typing import Any

import numpy as np
import torch

from jobs.distributed import DistEnv, barrier

MARKER = "COMPLETE"
PREEMPT_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)


def _tag(step: int) -> str:
    return f"step{step:08d}"


def complete_checkpoints(ckpt_dir: Path) -> list[Path]:
    """Complete checkpoint folders, oldest first."""
    if not ckpt_dir.exists():
        return []
    return sorted(p.parent for p in ckpt_dir.glob(f"step*/{MARKER}"))


def latest(ckpt_dir: Path) -> Path | None:
    found = complete_checkpoints(ckpt_dir)
    return found[-1] if found else None


def read_state(tag_dir: Path) -> dict[str, Any]:
    return json.loads((tag_dir / MARKER).read_text())


def save(engine: Any, env: DistEnv, ckpt_dir: Path, state: dict[str, Any], keep: int) -> Path:
    """Save engine + RNG + loop `state` (must hold 'step'); returns the tag folder."""
    tag = _tag(state["step"])
    engine.save_checkpoint(str(ckpt_dir), tag=tag, save_latest=False)
    rng = {
        "torch": torch.get_rng_state(),
        "numpy": np.random.get_state(),
        "python": random.getstate(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
    }
    torch.save(rng, ckpt_dir / tag / f"rng_rank{env.rank}.pt")
    barrier(env)
    if env.is_main:
        tmp = ckpt_dir / tag / (MARKER + ".tmp")
        tmp.write_text(json.dumps({**state, "world_size": env.world_size}))
        tmp.replace(ckpt_dir / tag / MARKER)
        for old in complete_checkpoints(ckpt_dir)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    barrier(env)
    return ckpt_dir / tag


def load(engine: Any, env: DistEnv, tag_dir: Path) -> dict[str, Any]:
    """Restore engine and this rank's RNG states from a complete checkpoint."""
    path, _ = engine.load_checkpoint(str(tag_dir.parent), tag=tag_dir.name)
    if path is None:
        raise RuntimeError(f"DeepSpeed could not load the checkpoint in {tag_dir}")
    rng_file = tag_dir / f"rng_rank{env.rank}.pt"
    if rng_file.exists():
        rng = torch.load(rng_file, weights_only=False)
        torch.set_rng_state(rng["torch"])
        np.random.set_state(rng["numpy"])
        random.setstate(rng["python"])
        if rng["cuda"] is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(rng["cuda"])
    return read_state(tag_dir)


class PreemptionFlag:
    """Records SIGTERM / SIGUSR1 / SIGUSR2; the loop checkpoints at the next step boundary."""

    def __init__(self) -> None:
        self.signal: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> PreemptionFlag:
        try:
            for sig in PREEMPT_SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        except ValueError:  # not the main thread (e.g. some Ray workers): no handlers
            self._previous.clear()
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        self.signal = signum

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    @property
    def raised(self) -> bool:
        return self.signal is not None
