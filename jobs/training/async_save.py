"""Checkpoints written while training goes on (train.async_checkpoint; issue 26).

`engine.save_checkpoint` hands each file's state dict to the engine's checkpoint engine.
Inside `snapshots(engine)` that engine is one that copies the state to host memory and
keeps it (tensors cloned, everything else deep-copied: the next step changes the live
state in place), so the call returns once the copy is made. A `BackgroundWriter` thread
then writes the files (flushed to disk), digests them, and records this rank's digests in
`<tag>/digests.rank<r>.json`; rank 0's thread waits for every rank's record, merges them
and writes the marker last (jobs.training.checkpoint.commit), then removes the checkpoints
it supersedes. No collective runs off the training thread: the ranks meet through files.

What stays true: a checkpoint is marked complete only once all its files are on disk and
digested; until then it is not a candidate, and the older checkpoints are kept, so a crash
mid-save resumes from the previous one. One save is in flight at a time (the next save,
and the end of training, wait for it), so nothing mistakes a save in progress for an
abandoned one.
"""

from __future__ import annotations

import copy
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from scalelab.jobs.training import checksums
from scalelab.jobs.training.distributed import DistEnv

DIGESTS = "digests.rank{rank}.json"  # one rank's part of the record, merged by rank 0
Files = list[tuple[Path, Any]]  # (path, host copy of what goes in it)


def host_copy(item: Any) -> Any:
    """`item` with every tensor cloned to host memory and every other leaf deep-copied."""
    if torch.is_tensor(item):
        return item.detach().to("cpu", copy=True)
    if isinstance(item, dict):
        return type(item)((k, host_copy(v)) for k, v in item.items())
    if isinstance(item, list | tuple):
        return type(item)(host_copy(v) for v in item)
    return copy.deepcopy(item)


class _Snapshots:
    """Stands in for the engine's checkpoint engine during one save_checkpoint: every
    `save` is kept as a host copy; all else is the engine's own."""

    def __init__(self, inner: Any, files: Files) -> None:
        self._inner, self._files = inner, files

    def save(self, state_dict: Any, path: str) -> None:
        self._files.append((Path(path), host_copy(state_dict)))

    def create(self, info: Any) -> None:
        pass

    def commit(self, info: Any) -> bool:
        return True

    def is_decoupled(self) -> bool:
        return False

    def preserves_storage_sharing(self) -> bool:
        return False  # DeepSpeed need not clone for torch.save: host_copy does

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


@contextmanager
def snapshots(engine: Any) -> Iterator[Files]:
    """Within: the engine's saves are copied to host memory, into the list yielded."""
    files: Files = []
    inner = engine.checkpoint_engine
    engine.checkpoint_engine = _Snapshots(inner, files)
    try:
        yield files
    finally:
        engine.checkpoint_engine = inner


class BackgroundWriter:
    """Writes one save's files on a thread of its own; `wait` returns when it is done
    (raising what it failed with). `timeout_s`: how long rank 0 waits for the other
    ranks' records (the process group's timeout: a rank that long behind has failed)."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._tag_dir: Path | None = None
        self._abandoned = threading.Event()

    def start(self, env: DistEnv, tag_dir: Path, files: Files,
              commit: Callable[[dict[str, dict]], None]) -> None:  # fmt: skip
        """Write `files`, digest them, and (rank 0) `commit(all ranks' digests)`."""
        self.wait()
        self._tag_dir, self._error = tag_dir, None
        self._thread = threading.Thread(target=self._run, args=(env, tag_dir, files, commit),
                                        name="checkpoint-writer", daemon=True)  # fmt: skip
        self._thread.start()

    def abandon(self) -> None:
        """Stop the save in flight without marking it (training failed: another rank's
        records may never come); its folder stays unmarked, never a candidate."""
        self._abandoned.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._error = None
        self._abandoned.clear()

    def wait(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise RuntimeError(f"saving checkpoint {self._tag_dir} failed") from error

    def _run(self, env: DistEnv, tag_dir: Path, files: Files,
             commit: Callable[[dict[str, dict]], None]) -> None:  # fmt: skip
        try:
            names = []
            while files:
                path, state = files.pop(0)  # its host copy is freed once written
                self._go_on()
                _write(path, state)
                names.append(path.name)
            threads = checksums.hash_threads(env.local_world_size)
            mine = checksums.digests(tag_dir, names, threads)
            _write_text(tag_dir / DIGESTS.format(rank=env.rank), json.dumps(mine))
            if env.is_main:
                commit(self._gathered(tag_dir, env.world_size))
        except BaseException as e:  # reported by wait(), on the training thread
            self._error = e

    def _gathered(self, tag_dir: Path, world_size: int) -> dict[str, dict]:
        records = [tag_dir / DIGESTS.format(rank=r) for r in range(world_size)]
        deadline = time.monotonic() + self.timeout_s
        while not all(p.exists() for p in records):
            if time.monotonic() > deadline:
                missing = [p.name for p in records if not p.exists()]
                raise TimeoutError(f"{', '.join(missing)} not written in {self.timeout_s:.0f} s")
            self._go_on()
            time.sleep(0.2)
        self._go_on()
        files: dict[str, dict] = {}
        for path in records:
            files |= json.loads(path.read_text())
            path.unlink()  # merged: the marker records the files, not this
        return files

    def _go_on(self) -> None:
        if self._abandoned.is_set():
            raise RuntimeError("abandoned")


def _write(path: Path, state: Any) -> None:
    """torch.save, then flushed to disk: the marker may only follow bytes that are there."""
    with open(path, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())


def _write_text(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)
