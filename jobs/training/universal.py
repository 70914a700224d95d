"""Resuming on another number of ranks through DeepSpeed's universal checkpoints.

A ZeRO checkpoint (stages 1-3, and bf16 at stage 0, whose optimizer also shards) holds one
optimizer shard per rank, cut for the world size that wrote it. `ds_to_universal` rewrites
it as one file per parameter and state (fp32 weight, Adam moments), which DeepSpeed loads
into any world size when its config says `checkpoint.load_universal`. The converter needs
`universal_checkpoint_info` in the saved model state; `record_info` makes the engine save
it with every checkpoint.

`convert` runs the converter as a process of its own with pools of workers, before the
process group starts (jobs.training.checkpoint.prepare_resume), and records a finished
conversion last, so a retry keeps it; a conversion cut short continues where it stopped:
every work item of the converter's two long phases (one rank's shard extracted, one
parameter merged) is recorded when it is done and skipped by a retry (docs/training.md,
'Checkpoints and preemption').
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import functools
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

from scalelab.jobs.training import shared_lock

UNIVERSAL_DIR = "universal"  # ckpt/universal/<tag>: a conversion, removed once loaded
CONVERTED = "CONVERTED"  # in a finished conversion, written last: {"source": its key, ...}
FAILED_SUFFIX = ".FAILED"  # ckpt/universal/<tag>.FAILED: why it could not be converted
PARTIAL_SUFFIX = ".partial"  # ckpt/universal/<tag>.partial: a conversion under way
RESUME_DIR = "resume"  # in <tag>.partial: its source's key, and what of it is done
DS_TEMP_DIR = "tmp"  # ds_to_universal's fragments, in its output folder (its main())
# ds_to_universal's work items, each a call that its pools make with the item last: the
# extract phase cuts one rank's optimizer shard into per-parameter fragments (in tmp/), the
# merge phase joins one parameter's fragments into its files (in zero/); both overwrite
# whatever an earlier, killed call left half-written.
PHASE_WORK = {
    "extract": ("extract_zero_shards", "extract_zero_shards_stage3"),
    "merge": ("merge_tp_slices", "merge_zero3_slices"),
}


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
    into `<out_dir>.partial`, then CONVERTED last, then renames the folder into place: a
    conversion cut short is never taken for a finished one, and a finished one is never
    redone. One cut short is continued: the work items it finished are skipped."""
    if converted(out_dir, key):
        return "already converted"
    extract, merge = workers or pool_sizes(tag_dir)
    for stale in out_dir.parent.glob(out_dir.name + ".partial-*"):
        shutil.rmtree(stale, ignore_errors=True)  # an earlier scalelab's per-process folders
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
    took = f"{time.monotonic() - t0:.1f} s with {extract} extract and {merge} merge workers"
    resumed = _record(out_dir / CONVERTED).get("resumed") or {}
    if any(resumed.values()):
        done = " and ".join(f"{n} {phase}" for phase, n in resumed.items())
        took += f", continuing a conversion cut short ({done} items done before)"
    return took


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

    # ds_to_universal's pools must inherit the allow-list (and the records of
    # `_resumable_work`): forked, not spawned
    multiprocessing.set_start_method("fork", force=True)
    partial = out_dir.with_name(out_dir.name + PARTIAL_SUFFIX)
    resume = partial / RESUME_DIR
    args = argparse.Namespace(
        input_folder=str(tag_dir),
        output_folder=str(partial),
        num_extract_workers=extract,
        num_merge_workers=merge,
        keep_temp_folder=True,  # until the whole conversion is done: a retry may need it
        strict=True,
        inject_missing_state=False,
    )
    t0 = time.monotonic()
    with _locked(partial.with_name(partial.name + ".lock")):
        if _record(resume / "source.json").get("source") != key:
            shutil.rmtree(partial, ignore_errors=True)  # another checkpoint's, or none
            resume.mkdir(parents=True)
            _write_atomic(resume / "source.json", json.dumps({"source": key}))
        resumed = {phase: len(list((resume / phase).glob("*.json"))) for phase in PHASE_WORK}
        with weights_only_loading(), _resumable_work(resume):
            ds_to_universal.main(args)
        shutil.rmtree(partial / DS_TEMP_DIR)
        shutil.rmtree(resume)
        record = {"source": key, "seconds": round(time.monotonic() - t0, 1),
                  "workers": {"extract": extract, "merge": merge}, "resumed": resumed}  # fmt: skip
        _write_atomic(partial / CONVERTED, json.dumps(record))  # last: the conversion is whole
        partial.rename(out_dir)


@contextlib.contextmanager
def _locked(lock_file: Path) -> Iterator[None]:
    """One converter per partial folder: a POSIX lock (lockf), released when the converter
    dies and, unlike flock, not held by the pool workers it forked; a lock file where the
    file system keeps locks per node or has none (jobs/training/shared_lock.py)."""
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    with shared_lock.exclusive(lock_file, fcntl.lockf):
        yield


@contextlib.contextmanager
def _resumable_work(resume: Path) -> Iterator[None]:
    """While ds_to_universal.main runs: each work item of PHASE_WORK recorded in
    `resume/<phase>/` when its call returns (with what it returned), and a recorded one
    not called again. DeepSpeed's own functions do the work; its pools pickle them by
    name, so the recording stand-ins take their names in its module."""
    from deepspeed.checkpoint import ds_to_universal

    originals = {}
    for phase, names in PHASE_WORK.items():
        (resume / phase).mkdir(parents=True, exist_ok=True)
        for name in names:
            originals[name] = getattr(ds_to_universal, name)
            setattr(ds_to_universal, name, _recorded(originals[name], phase, resume / phase))
    try:
        yield
    finally:
        for name, work in originals.items():
            setattr(ds_to_universal, name, work)


def _recorded(work: Any, phase: str, records: Path) -> Any:
    @functools.wraps(work)
    def once(*args: Any, **kwargs: Any) -> Any:
        _die_with_parent()  # a pool worker (forked: that is not inherited) dies with the converter
        item = repr(args[-1])  # the work item: a rank's indices, a parameter (and shapes)
        record = records / (hashlib.sha256(item.encode()).hexdigest()[:24] + ".json")
        if done := _record(record):
            print(f"[scalelab] {phase} {item}: done before, skipped", flush=True)
            return set(done["result"]) if done.get("set") else done["result"]
        result = work(*args, **kwargs)  # None, or the set of patterns a merge left unused
        is_set = isinstance(result, set)
        saved = {"item": item, "result": sorted(result) if is_set else result, "set": is_set}
        _write_atomic(record, json.dumps(saved))
        return result

    return once


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
