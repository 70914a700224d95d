"""An exclusive lock that holds across the nodes of a shared filesystem.

The kernel's file lock (flock, or lockf's POSIX lock) comes first: a waiter sleeps in the
kernel, so 63 waiting ranks do not poll the filesystem, and the lock goes with a process
that dies. Not every cluster filesystem holds it across nodes (`node_local_locks`, from
the mount's type and options in /proc/self/mountinfo):
- Lustre keeps locks per node when mounted `localflock`, and has none (the call fails)
  when mounted `noflock`, the default of older clients: neither `flock` nor `localflock`;
- BeeGFS keeps them per node unless its clients are configured for global locks
  (`tuneUseGlobalFileLocks`, which the mount options do not show);
- NFS keeps them per node when mounted `nolock` or with `local_lock=` other than `none`;
  otherwise lockd (v3) or the protocol (v4) holds them across nodes, flock included
  (Linux emulates it with POSIX locks there).
There, and wherever the lock call fails with ENOLCK, EOPNOTSUPP or ENOSYS, a lock file is
the lock: created with O_CREAT|O_EXCL (atomic on any POSIX shared filesystem, NFSv3 and
later included), holding its owner's host, pid and start time, and touched every
`heartbeat_s` while held. A waiter polls it and takes it over from an owner that is gone:
a dead pid on the waiter's own host at once, any other owner once the file has not
changed for `stale_after_s` by the waiter's own clock (the nodes' clocks need not agree).
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

NO_KERNEL_LOCK = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS)
HELD_SUFFIX = ".held"  # <lock file>.held: the lock file, where it is the lock
BREAK_SUFFIX = ".break"  # <lock file>.held.break: held while a stale owner is removed
log = logging.getLogger(__name__)
_announced: set[str] = set()


@dataclass(frozen=True)
class LockFileTiming:
    poll_s: float = 1.0
    heartbeat_s: float = 10.0
    # above the heartbeat plus the attribute caching of an NFS client (60 s by default)
    stale_after_s: float = 120.0


@dataclass(frozen=True)
class Mount:
    mount_point: str
    fstype: str
    options: frozenset[str]  # the mount's and its filesystem's (mountinfo's super options)


@contextmanager
def exclusive(
    lock_file: Path,
    kernel_lock: Callable[[Any, int], Any] = fcntl.flock,
    timing: LockFileTiming = LockFileTiming(),
) -> Iterator[None]:
    """Hold the lock named `lock_file` while the block runs: `kernel_lock` (fcntl.flock or
    fcntl.lockf) on it where the filesystem holds that across nodes, else the lock file
    `<lock_file>.held`. Every process of a job takes the same kind: the kind follows
    from the mount, which the nodes of a cluster mount alike."""
    why = node_local_locks(mount_of(lock_file.parent))
    if not why:
        with open(lock_file, "a") as f:
            try:
                kernel_lock(f, fcntl.LOCK_EX)
            except OSError as e:
                if e.errno not in NO_KERNEL_LOCK:
                    raise
                why = f"locking {lock_file} failed: {e.strerror}"
            else:
                try:
                    yield
                finally:
                    kernel_lock(f, fcntl.LOCK_UN)
                return
    held = lock_file.with_name(lock_file.name + HELD_SUFFIX)
    if why not in _announced:
        _announced.add(why)
        log.warning("file locks do not hold across nodes here (%s): locking with %s", why, held)
    with lock_file_held(held, timing):
        yield


# -- the filesystem's locks -------------------------------------------------------------
def parse_mountinfo(text: str) -> list[Mount]:
    """The mounts of /proc/self/mountinfo's lines (proc(5)): `id parent major:minor root
    mount-point options [optional fields...] - fstype source super-options`."""
    mounts = []
    for line in text.splitlines():
        fields = line.split(" ")
        if "-" not in fields[6:]:
            continue
        end = fields.index("-", 6)
        fstype, super_options = fields[end + 1], (fields[end + 3 :] or [""])[0]
        options = frozenset(fields[5].split(",") + super_options.split(","))
        mounts.append(Mount(_unescaped(fields[4]), fstype, options))
    return mounts


def _unescaped(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash in octal (\\040...)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), field)


def mount_of(path: Path, mountinfo: Path = Path("/proc/self/mountinfo")) -> Mount | None:
    """The mount `path` is on: the longest mount point above it, the last mounted of equals."""
    try:
        mounts = parse_mountinfo(mountinfo.read_text(errors="replace"))
    except OSError:
        return None
    real = os.path.realpath(path)
    above = [m for m in mounts if os.path.commonpath([real, m.mount_point]) == m.mount_point]
    return max(reversed(above), key=lambda m: len(m.mount_point), default=None)


def node_local_locks(mount: Mount | None) -> str:
    """Why the kernel's file locks on `mount` do not hold across nodes ('' where they do,
    as far as its type and options tell)."""
    if mount is None:
        return ""
    options = mount.options
    if mount.fstype == "lustre" and "localflock" in options:
        return f"{mount.mount_point} is Lustre mounted localflock: locks hold on one node"
    if mount.fstype == "lustre" and "flock" not in options:
        return f"{mount.mount_point} is Lustre mounted without flock: it has no locks"
    if mount.fstype == "beegfs":
        return f"{mount.mount_point} is BeeGFS: locks hold on one node unless configured global"
    if mount.fstype in ("nfs", "nfs4"):
        local = sorted(o for o in options if o == "nolock" or o.startswith("local_lock="))
        if local and local != ["local_lock=none"]:
            how = ",".join(o for o in local if o != "local_lock=none")
            return f"{mount.mount_point} is NFS mounted {how}: locks hold on one node"
    return ""


# -- the lock file ----------------------------------------------------------------------
@contextmanager
def lock_file_held(path: Path, timing: LockFileTiming = LockFileTiming()) -> Iterator[None]:
    """Own the lock file `path` while the block runs (see the module's docstring)."""
    owner = {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "since": time.time(),
        "token": uuid.uuid4().hex,
    }
    _acquire(path, json.dumps(owner).encode(), timing)
    stop = threading.Event()
    beat = threading.Thread(
        target=_heartbeat,
        args=(path, stop, timing.heartbeat_s),
        name=f"heartbeat of {path.name}",
        daemon=True,
    )
    beat.start()
    try:
        yield
    finally:
        stop.set()
        beat.join()
        if _owner(path).get("token") == owner["token"]:  # not taken over from a stalled us
            path.unlink(missing_ok=True)


def _acquire(path: Path, content: bytes, timing: LockFileTiming) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    held, breaking = _Unchanged(), _Unchanged()
    while True:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            pass
        else:
            with os.fdopen(fd, "wb") as f:
                f.write(content)
            return
        seen = _observed(path)
        if seen is None:
            continue  # released just now
        if _owner_died_here(seen[0]) or held.seconds(seen) > timing.stale_after_s:
            _take_over(path, seen, breaking, timing)
            continue
        time.sleep(timing.poll_s)


def _take_over(
    path: Path, seen: tuple[bytes, int], breaking: _Unchanged, timing: LockFileTiming
) -> None:
    """Remove the lock file `seen` of an owner that is gone, unless it changed since. One
    waiter at a time (the .break file): another could take a new owner's file for the old
    one's. A .break file left by a waiter that died is removed once it is stale."""
    breaker = path.with_name(path.name + BREAK_SUFFIX)
    try:
        fd = os.open(breaker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        state = _observed(breaker)
        if state is not None and breaking.seconds(state) > timing.stale_after_s:
            breaker.unlink(missing_ok=True)
        time.sleep(timing.poll_s)
        return
    try:
        if _observed(path) == seen:
            log.warning(
                "took over the lock %s from an owner that is gone: %s",
                path,
                seen[0].decode(errors="replace") or "(empty)",
            )
            path.unlink(missing_ok=True)
    finally:
        os.close(fd)
        breaker.unlink(missing_ok=True)


def _heartbeat(path: Path, stop: threading.Event, every_s: float) -> None:
    while not stop.wait(every_s):
        try:
            os.utime(path)
        except OSError:  # taken over: the block finishes all the same
            pass


class _Unchanged:
    """How long a file has looked the same (content, mtime) to this process, by its own
    clock."""

    def __init__(self) -> None:
        self.state: tuple[bytes, int] | None = None
        self.since = time.monotonic()

    def seconds(self, state: tuple[bytes, int]) -> float:
        if state != self.state:
            self.state, self.since = state, time.monotonic()
        return time.monotonic() - self.since


def _observed(path: Path) -> tuple[bytes, int] | None:
    """The file's content and mtime; opened afresh, so an NFS client asks the server."""
    try:
        with open(path, "rb") as f:
            return f.read(), os.fstat(f.fileno()).st_mtime_ns
    except FileNotFoundError:
        return None


def _owner(path: Path) -> dict[str, Any]:
    seen = _observed(path)
    return _parsed(seen[0]) if seen else {}


def _parsed(content: bytes) -> dict[str, Any]:
    try:
        owner = json.loads(content)
    except ValueError:
        return {}
    return owner if isinstance(owner, dict) else {}


def _owner_died_here(content: bytes) -> bool:
    """Whether the lock file names a process of this host that no longer runs."""
    owner = _parsed(content)
    if owner.get("host") != socket.gethostname() or not isinstance(owner.get("pid"), int):
        return False
    try:
        os.kill(owner["pid"], 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # another user's process
        return False
    return False
