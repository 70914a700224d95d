"""A sweep being submitted, before its first record exists (docs/monitoring.md).

`scalelab submit` spends seconds checking and planning, and starting Ray, before the sweep
is in the tracking store; in that time `status` would say "no sweep named". So the submit
leaves a note, `$SCALELAB_HOME/submitting/<name>.json` (its pid, host and start), for as
long as it runs, and `status` reads it: a note whose process is gone is not believed."""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from scalelab.contract import workdir


@dataclass(frozen=True)
class Submitting:
    sweep: str
    pid: int
    started: float  # time.time()

    def line(self) -> str:
        seconds = max(0.0, time.time() - self.started)
        return (
            f"sweep {self.sweep!r} is being submitted (pid {self.pid}, {seconds:.0f} s ago): "
            "its trials are listed here once it is checked and planned"
        )


def _note(sweep: str) -> Path:
    return workdir.scalelab_home() / "submitting" / f"{sweep}.json"


@contextmanager
def submitting(sweep: str) -> Iterator[None]:
    """The note, for as long as the block runs."""
    note = _note(sweep)
    mine = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()}
    try:
        note.parent.mkdir(parents=True, exist_ok=True)
        tmp = note.with_name(f"{note.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(mine))
        tmp.replace(note)
    except OSError:
        note = None  # a read-only home: the submit goes on without the note
    try:
        yield
    finally:
        if note is not None:
            try:
                if json.loads(note.read_text()).get("pid") == mine["pid"]:
                    note.unlink()
                note.parent.rmdir()  # when no other submit's note is there
            except (OSError, ValueError):
                pass


def being_submitted(sweep: str) -> Submitting | None:
    """The submit of `sweep` running now on this host, if any."""
    try:
        found = json.loads(_note(sweep).read_text())
        pid, host, started = int(found["pid"]), str(found["host"]), float(found["started"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if host != socket.gethostname():
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass  # alive, another user's
    return Submitting(sweep, pid, started)
