"""Two drivers on one sweep never both launch a trial. A driver *claims* a trial by logging
the param `scalelab.claim.<n>` = its id: MLflow params are write-once (a second, different
value is rejected by the store, atomically), so exactly one driver wins epoch n. A claim
lapses when its driver is gone, and only then can the next epoch be claimed.

Whether a driver is gone is decided without comparing two hosts' clocks. Every driver beats
(a tag on the parent run, rewritten every lease / 4). On the beat's own host its pid says
it; elsewhere the reader watches the beat on its own monotonic clock: a beat that changed
while it watched is a live driver, one unchanged for a whole lease a dead one, and one it
has just seen for the first time is UNKNOWN until one of those happens (a lease at most).
The beat's timestamp is read only to drop a beat older than STALE_S by the reader's clock:
a skew below that changes nothing (before, a dead driver on a host whose clock ran ahead
kept its trials for the skew plus a lease, and a live one whose clock ran behind by more
than a lease lost them).
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from enum import Enum
from functools import cached_property
from typing import TYPE_CHECKING

from scalelab.contract.runs import Param, Tag
from scalelab.orchestrator.ledger.connection import SweepStore

if TYPE_CHECKING:
    from scalelab.orchestrator.ledger.records import TrialRecord

STALE_S = 3600.0  # a beat older than this by the reader's clock is a dead driver's


class Liveness(Enum):
    ALIVE = "alive"
    DEAD = "dead"
    UNKNOWN = "unknown"  # another host's beat, not watched for a lease yet


def new_driver_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


class Claims(SweepStore):
    driver_id: str
    lease_s: float

    def heartbeat(self, poll: bool = False) -> None:
        """Tell other drivers this one is alive; `poll`: a periodic beat, tried once
        (`poll_client`)."""
        host, pid, _ = self.driver_id.split(":")
        beat = json.dumps({"t": time.time(), "host": host, "pid": int(pid)})
        client = self.poll_client if poll else self.client
        client.set_tag(self.parent_id, _beat_key(self.driver_id), beat)

    def retire(self) -> None:
        """This driver is done: its beat goes, so its claims lapse at once. Else a driver
        started later in the same process (a notebook's next submit, `scalelab eval SWEEP`
        after a submit) would find them held by a live pid for a lease. A store that fails
        now leaves the beat to age out."""
        from mlflow.exceptions import MlflowException

        from scalelab.orchestrator.ledger.connection import LedgerUnavailable

        try:
            self.poll_client.delete_tag(self.parent_id, _beat_key(self.driver_id))
        except (LedgerUnavailable, MlflowException):
            pass

    def liveness(self, driver_id: str | None, parent_tags: dict[str, str]) -> Liveness:
        if driver_id is None:
            return Liveness.DEAD
        if driver_id == self.driver_id:
            return Liveness.ALIVE
        key = _beat_key(driver_id)
        raw = parent_tags.get(key)
        return Liveness.DEAD if raw is None else self._beat_liveness(key, raw)

    def driver_alive(self, driver_id: str | None, parent_tags: dict[str, str]) -> bool:
        """Not known to be gone (a driver not watched for a lease yet counts as alive)."""
        return self.liveness(driver_id, parent_tags) is not Liveness.DEAD

    def live_drivers(self, parent_tags: dict[str, str]) -> dict[str, Liveness]:
        """The drivers of this sweep other than this one that are not known to be gone."""
        live = {}
        for key, raw in parent_tags.items():
            if not key.startswith(Tag.DRIVER_PREFIX) or key == _beat_key(self.driver_id):
                continue
            state = self._beat_liveness(key, raw)
            if state is not Liveness.DEAD:
                live[key.removeprefix(Tag.DRIVER_PREFIX)] = state
        return live

    def claim(self, rec: TrialRecord, parent_tags: dict[str, str] | None = None) -> bool:
        """Try to own a trial; True when this driver owns it now."""
        from mlflow.exceptions import MlflowException

        epoch, owner = rec.claim
        if owner == self.driver_id:
            return True
        if owner is not None and self.driver_alive(owner, parent_tags or self.parent_tags()):
            return False
        try:
            self.client.log_param(rec.run_id, f"{Param.CLAIM_PREFIX}{epoch + 1}", self.driver_id)
        except MlflowException:
            return False  # another driver logged this epoch first
        rec.params[f"{Param.CLAIM_PREFIX}{epoch + 1}"] = self.driver_id
        return True

    def _beat_liveness(self, key: str, raw: str) -> Liveness:
        beat = json.loads(raw)
        if beat["host"] == socket.gethostname():  # one clock: the pid, then the beat's age
            if not _pid_alive(beat["pid"]):
                return Liveness.DEAD
            return Liveness.ALIVE if time.time() - beat["t"] < self.lease_s else Liveness.DEAD
        now = time.monotonic()
        seen = self._watched.get(key)
        if seen is None:  # first sight: a beat from long ago, else not known yet
            stale = time.time() - beat["t"] > STALE_S
            state = Liveness.DEAD if stale else Liveness.UNKNOWN
        elif seen[0] != raw:
            state = Liveness.ALIVE  # it beat while this driver watched
        elif now - seen[1] >= self.lease_s:
            return Liveness.DEAD  # unchanged for a whole lease
        else:
            return seen[2]
        self._watched[key] = (raw, now, state)
        return state

    @cached_property
    def _watched(self) -> dict[str, tuple[str, float, Liveness]]:
        """Beat key -> (the beat as last read, since when on this monotonic clock, what it
        means until it changes or a lease passes)."""
        return {}


def _beat_key(driver_id: str) -> str:
    return f"{Tag.DRIVER_PREFIX}{driver_id.replace(':', '_')}"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
