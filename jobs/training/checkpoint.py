"""DeepSpeed checkpoints in trials/<trial_id>/ckpt/<tag>/ that are verified before they are
trusted, and set aside when they cannot be.

Saving: every rank saves its shard through `engine.save_checkpoint` and its RNG states (as
tensors, jobs.training.rng_state); after a barrier the ranks digest the folder's files
between them (jobs.training.checksums) and rank 0 writes `<tag>/COMPLETE` last: the sizes
and SHA-256 of every file, the world size, and the loop state (step, data position, tokens,
the MLflow run id). With train.async_checkpoint the same happens on background threads that
meet through files (jobs.training.async_save). A folder without that marker (a save cut
short by a kill) is never a candidate. The newest `keep` complete checkpoints are kept.

Resuming (`resume`), newest candidate first: the files are compared with the marker before
any is opened (the ranks share the work), then loaded with every `torch.load` restricted to
weights (jobs.training.safe_load), through a universal checkpoint when the rank count
changed (jobs.training.universal; made by `prepare_resume` before the process group
starts). A candidate that fails either step is moved to `ckpt/rejected/<tag>/` with the
reason in its `REJECTED` file (so it is never tried again) and the next older one is tried.
The ranks agree on every verdict, so they all load the same checkpoint.
"""

from __future__ import annotations

import copy
import fcntl
import logging
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Annotated, Any, Literal

import torch
import torch.distributed as dist
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from scalelab.jobs.training import (
    async_save,
    checksums,
    rng_state,
    safe_load,
    shared_lock,
    universal,
)
from scalelab.jobs.training.async_save import BackgroundWriter
from scalelab.jobs.training.distributed import DistEnv, barrier

MARKER = "COMPLETE"
REJECTED_DIR = "rejected"  # checkpoints set aside, each with the reason in REASON_FILE
REASON_FILE = "REJECTED"
CONVERSION_LOCK = "universal.lock"  # held by the one process converting (prepare_resume)
log = logging.getLogger(__name__)

FileName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$")]


class FileRecord(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    size: int = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class Marker(BaseModel):
    """The content of `<tag>/COMPLETE`."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    format: Literal[2]  # 1 (before checksums) was the bare loop state
    world_size: int = Field(ge=1)
    files: dict[FileName, FileRecord]
    state: dict[str, Any]


@dataclass(frozen=True)
class Resumed:
    state: dict[str, Any] | None  # the loop state of the checkpoint loaded; None: none usable
    skipped: tuple[str, ...]  # one line per checkpoint set aside, naming what was wrong
    engine_touched: bool  # a load was attempted: without `state`, the engine is not pristine


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


def read_marker(tag_dir: Path) -> Marker:
    return Marker.model_validate_json((tag_dir / MARKER).read_bytes())


def read_state(tag_dir: Path) -> dict[str, Any]:
    return read_marker(tag_dir).state


# -- saving -----------------------------------------------------------------------------
def save(engine: Any, env: DistEnv, ckpt_dir: Path, state: dict[str, Any], keep: int,
         writer: BackgroundWriter | None = None,
         then: Callable[[Path], None] | None = None) -> Path:  # fmt: skip
    """Save engine + RNG + loop `state` (must hold 'step'); returns the tag folder. With a
    `writer` (train.async_checkpoint) the state is copied to host memory here and written,
    digested and marked complete by the writer's thread while training goes on. `then`:
    called by rank 0 with the tag folder once it is marked complete (on the writer's
    thread if there is one), e.g. to upload it (jobs.training.remote_checkpoints)."""
    tag = _tag(state["step"])
    tag_dir = ckpt_dir / tag
    if writer is not None:
        writer.wait()  # one save in flight: its folder is never taken for an abandoned one
    if env.is_main:  # a step saved again starts from an empty folder: no stale shard stays
        shutil.rmtree(tag_dir, ignore_errors=True)
    barrier(env)
    if writer is not None:
        with async_save.snapshots(engine) as files:
            engine.save_checkpoint(str(ckpt_dir), tag=tag, save_latest=False)
        files.append((tag_dir / f"rng_rank{env.rank}.pt", rng_state.capture()))
        done = partial(commit, ckpt_dir, tag_dir, env.world_size, state=copy.deepcopy(state),
                       keep=keep, then=then)  # fmt: skip
        writer.start(env, tag_dir, files, done)
        return tag_dir
    engine.save_checkpoint(str(ckpt_dir), tag=tag, save_latest=False)
    torch.save(rng_state.capture(), tag_dir / f"rng_rank{env.rank}.pt")
    barrier(env)
    sizes = {p.name: p.stat().st_size for p in tag_dir.iterdir() if p.is_file()}
    mine = checksums.share(sizes, env.rank, env.world_size)
    files = _merged(env, checksums.digests(tag_dir, mine, _threads(env)))
    if env.is_main:
        commit(ckpt_dir, tag_dir, env.world_size, files, state, keep, then)
    barrier(env)
    return tag_dir


def commit(ckpt_dir: Path, tag_dir: Path, world_size: int, files: dict[str, dict],
           state: dict[str, Any], keep: int,
           then: Callable[[Path], None] | None = None) -> None:  # fmt: skip
    """Rank 0, once every file of `tag_dir` is written and digested: the marker (last, in
    one rename), then the checkpoints it supersedes are removed, then `then(tag_dir)`."""
    marker = Marker(format=2, world_size=world_size, files=files, state=state)
    tmp = tag_dir / (MARKER + ".tmp")
    tmp.write_text(marker.model_dump_json())
    tmp.replace(tag_dir / MARKER)
    for old in complete_checkpoints(ckpt_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    for unmarked in ckpt_dir.glob("step*"):  # a save that never completed: unusable
        if unmarked.is_dir() and not (unmarked / MARKER).exists():
            shutil.rmtree(unmarked, ignore_errors=True)
    if then is not None:
        then(tag_dir)


def _threads(env: DistEnv) -> int:
    return checksums.hash_threads(env.local_world_size)


# -- converting before the process group ------------------------------------------------
def prepare_resume(ckpt_dir: Path, world_size: int) -> str:
    """Every rank, before the process group starts: if the checkpoint `resume` will load
    was written by another rank count, make its universal form now (issue 26). The first
    process to take the lock converts, the others wait on the lock, never in a collective
    (whose timeout a 79 GB conversion outlasts), then find the conversion done. Candidates
    are tried newest first as `resume` does: one that fails verification or conversion gets
    a `<tag>.FAILED` record (so no other rank tries it again) and the next older is tried.
    Returns what was done, for the log ('' if nothing)."""
    if latest(ckpt_dir) is None:
        return ""
    with exclusive(ckpt_dir / CONVERSION_LOCK):
        for tag_dir in reversed(complete_checkpoints(ckpt_dir)):
            try:
                saved_world = read_marker(tag_dir).world_size
            except (OSError, ValidationError):
                continue  # resume sets it aside
            if not universal.needed(tag_dir, saved_world, world_size):
                return ""
            out, key = universal.conversion_dir(ckpt_dir, tag_dir.name), _key(tag_dir)
            if universal.converted(out, key):
                return f"{tag_dir.name}: converted for {world_size} rank(s) already"
            if universal.failure(out, key):
                continue
            problem = verify(tag_dir)
            if not problem:
                try:
                    took = universal.convert(tag_dir, out, key)
                except Exception as e:
                    problem = f"converting it failed: {type(e).__name__}: {e}"
                else:
                    log.warning("converted %s for %d rank(s): %s", tag_dir, world_size, took)
                    return f"{tag_dir.name}: converted for {world_size} rank(s) in {took}"
            universal.record_failure(out, key, problem)
    return ""


@contextmanager
def exclusive(lock_file: Path) -> Iterator[None]:
    """An exclusive lock on `lock_file` that holds across nodes, waited for in the kernel
    (flock): 63 waiting ranks do not poll a shared file system, and the lock goes with a
    process that dies; a lock file where the file system keeps flock per node or has none
    (Lustre localflock or noflock, BeeGFS, NFS nolock: jobs/training/shared_lock.py)."""
    with shared_lock.exclusive(lock_file, fcntl.flock):
        yield


def _key(tag_dir: Path) -> str:
    return universal.source_key(tag_dir / MARKER)


# -- resuming ---------------------------------------------------------------------------
def resume(engine: Any, env: DistEnv, ckpt_dir: Path) -> Resumed:
    """Load the newest checkpoint that verifies and loads, setting aside the ones that do
    not. Every rank must call it (it is collective)."""
    skipped: list[str] = []
    touched = False
    while (tag_dir := latest(ckpt_dir)) is not None:
        problem = _agreed(env, _verify(env, tag_dir))
        if not problem:
            touched = True
            problem = _load(engine, env, ckpt_dir, tag_dir)
        if not problem:
            _remove_conversion(env, ckpt_dir)
            return Resumed(read_state(tag_dir), tuple(skipped), touched)
        where = _reject(env, ckpt_dir, tag_dir, problem)
        skipped.append(f"{tag_dir.name} (moved to {where}): {problem}")
    _remove_conversion(env, ckpt_dir)
    return Resumed(None, tuple(skipped), touched)


def verify(tag_dir: Path) -> str:
    """Every check `resume` makes before loading `tag_dir` (files as recorded, no pickle
    that would run code), by this process alone ('' if it passes): for reading a
    checkpoint outside training (jobs/training/trained_model.py)."""
    alone = DistEnv(0, 1, 0, 1, "127.0.0.1", 0, "none", "cpu", owns_process_group=False)
    return _verify(alone, tag_dir)


def _verify(env: DistEnv, tag_dir: Path) -> str:
    """This rank's share of the comparison of the files with their record ('' if equal)."""
    try:
        marker = read_marker(tag_dir)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "the file"
        return f"{tag_dir / MARKER} is not a record with checksums ({where}: {first['msg']})"
    except OSError as e:
        return f"{tag_dir / MARKER} is unreadable: {e}"
    records = {n: r.model_dump() for n, r in marker.files.items()}
    mine = checksums.share({n: r.size for n, r in marker.files.items()}, env.rank, env.world_size)
    try:
        found = checksums.mismatches(tag_dir, records, mine, _threads(env))
        if env.is_main:
            found += checksums.unrecorded(tag_dir, records, ignore={MARKER})
        if not found:  # the right bytes; now make sure none of them would run code
            found = [_refusal(tag_dir / name) for name in mine if name.endswith(".pt")]
    except OSError as e:  # a verdict all the same: the other ranks wait for it
        found = [f"reading {tag_dir} failed: {e}"]
    return "; ".join(p for p in found if p)


def _refusal(path: Path) -> str:
    try:
        refused = safe_load.refused_globals(path)
    except Exception as e:  # not a torch.save zip, or one torch cannot parse
        first_line = (str(e).splitlines() or [""])[0]
        return f"{path} is not a torch checkpoint: {type(e).__name__}: {first_line}"
    if refused:
        return f"{path} would call {', '.join(refused)} when unpickled (only data may load)"
    return ""


def _load(engine: Any, env: DistEnv, ckpt_dir: Path, tag_dir: Path) -> str:
    """Load `tag_dir` into the engine and this rank's RNG; the agreed problem ('' if none)."""
    saved_world = read_marker(tag_dir).world_size
    source = tag_dir
    with safe_load.weights_only_loading():
        if universal.needed(tag_dir, saved_world, env.world_size):
            source = universal.conversion_dir(ckpt_dir, tag_dir.name)
            problem = _agreed(env, _on_main(env, lambda: _converted(tag_dir, source)))
            if problem:
                return f"converting it for {env.world_size} rank(s) failed: {problem}"
        problem = ""
        converted = source != tag_dir
        try:
            universal.set_loading(engine, converted)
            with universal.repairing_zero3_load(engine) if converted else nullcontext():
                path, _ = engine.load_checkpoint(str(source.parent), tag=source.name)
            if path is None:
                raise RuntimeError(f"DeepSpeed found no model-states file in {source}")
            rng_file = tag_dir / f"rng_rank{env.rank}.pt"
            if rng_file.exists():  # absent for ranks the writing run did not have
                rng_state.restore(torch.load(rng_file, weights_only=True))
        except Exception as e:  # any failure: this checkpoint cannot be trusted
            problem = f"loading it failed: {type(e).__name__}: {str(e).strip()[:2000]}"
        finally:
            universal.set_loading(engine, False)
    return _agreed(env, problem)


def _converted(tag_dir: Path, out: Path) -> None:
    """The conversion prepare_resume made; made here, inside the process group, only for
    a checkpoint it did not reach (one that passed its checks there and failed them here)."""
    key = _key(tag_dir)
    if reason := universal.failure(out, key):
        raise RuntimeError(reason)
    if not universal.converted(out, key):
        log.warning("converting %s inside the process group (its timeout bounds the wait)", tag_dir)
        universal.convert(tag_dir, out, key)


def _on_main(env: DistEnv, work: Any) -> str:
    if not env.is_main:
        return ""
    try:
        work()
    except Exception as e:
        return f"{type(e).__name__}: {str(e).strip()[:2000]}"
    return ""


def _reject(env: DistEnv, ckpt_dir: Path, tag_dir: Path, problem: str) -> Path:
    """Move `tag_dir` out of the candidates (one rename) with the reason beside its files."""
    rejected = ckpt_dir / REJECTED_DIR
    dest, n = rejected / tag_dir.name, 1
    while dest.exists():
        dest, n = rejected / f"{tag_dir.name}.{n}", n + 1
    barrier(env)  # every rank has chosen the same name before rank 0 uses it
    if env.is_main:
        rejected.mkdir(exist_ok=True)
        tag_dir.rename(dest)
        (dest / REASON_FILE).write_text(problem + "\n")
        log.warning("checkpoint %s is not used and was moved to %s: %s", tag_dir, dest, problem)
    barrier(env)
    return dest


def _remove_conversion(env: DistEnv, ckpt_dir: Path) -> None:
    barrier(env)
    if env.is_main:
        shutil.rmtree(ckpt_dir / universal.UNIVERSAL_DIR, ignore_errors=True)


def _agreed(env: DistEnv, problem: str) -> str:
    """Every rank's problem joined, on every rank: all of them take the same branch."""
    if env.world_size == 1:
        return problem
    everyone: list[str | None] = [None] * env.world_size
    dist.all_gather_object(everyone, problem)
    return "; ".join(dict.fromkeys(p for p in everyone if p))


def _merged(env: DistEnv, mine: dict[str, dict]) -> dict[str, dict]:
    if env.world_size == 1:
        return mine
    everyone: list[dict | None] = [None] * env.world_size
    dist.all_gather_object(everyone, mine)
    return {name: rec for part in everyone for name, rec in (part or {}).items()}
