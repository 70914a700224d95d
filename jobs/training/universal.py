"""Resuming on another number of ranks through DeepSpeed's universal checkpoints.

A ZeRO checkpoint (stages 1-3, and bf16 at stage 0, whose optimizer also shards) holds one
optimizer shard per rank, cut for the world size that wrote it. `ds_to_universal` rewrites
it as one file per parameter and state (fp32 weight, Adam moments), which DeepSpeed loads
into any world size when its config says `checkpoint.load_universal`. The converter needs
`universal_checkpoint_info` in the saved model state; `record_info` makes the engine save
it with every checkpoint.

`convert` runs the converter as a process of its own with pools of workers, before the
process group starts (jobs.training.checkpoint.prepare_resume), and records a finished
conversion last, so a retry keeps it (docs/training.md, 'Checkpoints and preemption').
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

UNIVERSAL_DIR = "universal"  # ckpt/universal/<tag>: a conversion, removed once loaded
CONVERTED = "CONVERTED"  # in a finished conversion, written last: {"source": its key, ...}
FAILED_SUFFIX = ".FAILED"  # ckpt/universal/<tag>.FAILED: why it could not be converted


def record_info(model: torch.nn.Module) -> None:
    """Have DeepSpeed save the universal-checkpoint metadata with every checkpoint (read
    from the module in DeepSpeedEngine._save_checkpoint / _save_zero_checkpoint). The model
    has no tensor or pipeline parallelism, so the version key is all the converter needs."""
    from deepspeed.checkpoint.constants import (
        UNIVERSAL_CHECKPOINT_INFO,
        UNIVERSAL_CHECKPOINT_VERSION_KEY,
        UNIVERSAL_CHECKPOINT_VERSION_VALUE,
    )

    setattr(
        model,
        UNIVERSAL_CHECKPOINT_INFO,
        {UNIVERSAL_CHECKPOINT_VERSION_KEY: UNIVERSAL_CHECKPOINT_VERSION_VALUE},
    )


def needed(tag_dir: Path, saved_world: int, world: int) -> bool:
    """True when the checkpoint's optimizer state is sharded for another world size."""
    return saved_world != world and any(tag_dir.glob("*optim_states.pt"))


def conversion_dir(ckpt_dir: Path, tag: str) -> Path:
    return ckpt_dir / UNIVERSAL_DIR / tag


def source_key(marker_file: Path) -> str:
    """What a conversion records of its source: the SHA-256 of the source's marker, which
    holds the digest of every file (a checkpoint saved again under the same tag differs)."""
    return hashlib.sha256(marker_file.read_bytes()).hexdigest()


def converted(out_dir: Path, key: str) -> bool:
    """Whether `out_dir` holds a finished conversion of the checkpoint `key` names."""
    return _record(out_dir / CONVERTED).get("source") == key


def failure(out_dir: Path, key: str) -> str:
    """The reason recorded when converting (or verifying) the checkpoint `key` failed."""
    record = _record(out_dir.with_name(out_dir.name + FAILED_SUFFIX))
    return record.get("reason", "") if record.get("source") == key else ""


def record_failure(out_dir: Path, key: str, reason: str) -> None:
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    _write_atomic(out_dir.with_name(out_dir.name + FAILED_SUFFIX),
                  json.dumps({"source": key, "reason": reason}))  # fmt: skip


def _record(path: Path) -> dict[str, Any]:
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def pool_sizes(tag_dir: Path) -> tuple[int, int]:
    """ds_to_universal's extract and merge workers for `tag_dir`, from the cores this
    process may use and the memory available: an extract worker holds one rank's optimizer
    shard and the fragments it cuts from it (~3 x the file); a merge worker one parameter's
    fragments and their concatenation (DeepSpeed: fewer merge than extract workers)."""
    import psutil

    shards = [p.stat().st_size for p in tag_dir.glob("*optim_states.pt")]
    cpus = len(os.sched_getaffinity(0))
    by_memory = psutil.virtual_memory().available // max(1, 3 * max(shards, default=1))
    extract = max(1, min(cpus, len(shards), by_memory))
    return extract, max(1, min(cpus, by_memory) // 2)


def convert(tag_dir: Path, out_dir: Path, key: str, workers: tuple[int, int] | None = None) -> str:
    """Write the universal form of `tag_dir` to `out_dir` unless a finished conversion of
    it is there already; returns what the conversion took. The converter is a process of
    its own (`python -m scalelab.jobs.training.universal`, below: its pools are forked from
    a process that has done nothing else, with the safe-loading allow-list) that writes
    into `<out_dir>.partial-<pid>`, then CONVERTED last, then renames the folder into
    place: a conversion cut short is never taken for a finished one, and a finished one is
    never redone. A conversion cut short is redone (ds_to_universal cannot continue one)."""
    if converted(out_dir, key):
        return "already converted"
    extract, merge = workers or pool_sizes(tag_dir)
    for stale in out_dir.parent.glob(out_dir.name + ".partial-*"):
        shutil.rmtree(stale, ignore_errors=True)  # a conversion killed part-way
    shutil.rmtree(out_dir, ignore_errors=True)  # another checkpoint's, saved under this tag
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "scalelab.jobs.training.universal", str(tag_dir),
           str(out_dir), key, str(extract), str(merge)]  # fmt: skip
    t0 = time.monotonic()
    done = subprocess.run(cmd, stdout=sys.stderr, preexec_fn=_die_with_parent, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the universal-checkpoint converter exited with code "
                           f"{done.returncode} (its output is in the trial log)")  # fmt: skip
    if not converted(out_dir, key):
        raise RuntimeError(f"the converter finished without writing {out_dir / CONVERTED}")
    return f"{time.monotonic() - t0:.1f} s with {extract} extract and {merge} merge workers"


def _die_with_parent() -> None:
    """In the converter, before it runs: SIGKILL it when the process that started it dies,
    so a retry never finds an orphan still writing (Linux's PR_SET_PDEATHSIG)."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG


def _convert_here(tag_dir: Path, out_dir: Path, key: str, extract: int, merge: int) -> None:
    """The converter process's work (see `convert`)."""
    import multiprocessing

    from deepspeed.checkpoint import ds_to_universal

    from scalelab.jobs.training.safe_load import weights_only_loading

    # ds_to_universal's pools must inherit the allow-list: forked, not spawned
    multiprocessing.set_start_method("fork", force=True)
    partial = out_dir.with_name(f"{out_dir.name}.partial-{os.getpid()}")
    args = argparse.Namespace(
        input_folder=str(tag_dir),
        output_folder=str(partial),
        num_extract_workers=extract,
        num_merge_workers=merge,
        keep_temp_folder=False,
        strict=True,
        inject_missing_state=False,
    )
    t0 = time.monotonic()
    with weights_only_loading():
        ds_to_universal.main(args)
    record = {"source": key, "seconds": round(time.monotonic() - t0, 1),
              "workers": {"extract": extract, "merge": merge}}  # fmt: skip
    _write_atomic(partial / CONVERTED, json.dumps(record))  # last: the conversion is whole
    partial.rename(out_dir)


def set_loading(engine: Any, universal: bool) -> None:
    """Choose native or universal loading for the next `engine.load_checkpoint`. DeepSpeed
    reads this config flag only inside load_checkpoint (runtime/engine.py), never while
    building the engine, so it can be chosen per checkpoint: the config a trial was started
    with (deepspeed.json) stays as it is."""
    engine._config.load_universal_checkpoint = universal


@contextlib.contextmanager
def repairing_zero3_load(engine: Any) -> Iterator[None]:
    """Undo two slips of DeepSpeed's ZeRO-3 universal loader
    (stage3.load_hp_checkpoint_state_from_checkpoint_dir_stage3), harmless after the others:
    it gives every param group the first group's settings, so biases and norms would get
    the matrices' weight decay; and it puts one `step` tensor into every sub-group's Adam
    state, which AdamW then increments in place once per sub-group, so the bias correction
    runs ahead (measured: the loss drifted 1.4e-3 within 3 steps, even resuming 1 -> 1)."""
    own = [{k: v for k, v in g.items() if k != "params"} for g in engine.optimizer.param_groups]
    yield
    for group, settings in zip(engine.optimizer.param_groups, own, strict=True):
        group.update(settings)
    base = getattr(engine.optimizer, "optimizer", engine.optimizer)  # ZeRO wraps torch's
    for state in base.state.values():
        if torch.is_tensor(state.get("step")):
            state["step"] = state["step"].clone()


if __name__ == "__main__":  # the converter process of `convert`
    src, out, source, n_extract, n_merge = sys.argv[1:6]
    _convert_here(Path(src), Path(out), source, int(n_extract), int(n_merge))
