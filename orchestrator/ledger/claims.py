"""Two drivers on one sweep never both launch a trial. A driver *claims* a trial by logging
the param `scalelab.claim.<n>` = its id: MLflow params are write-once (a second, different
value is rejected by the store, atomically), so exactly one driver wins epoch n. A claim
lapses when its driver is gone: on this host its pid is dead, or its heartbeat (a tag on
the parent run) is older than the lease; then the next epoch can be claimed."""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from typing import TYPE_CHECKING

from scalelab.contract.runs import Param, Tag
from scalelab.orchestrator.ledger.store import SweepStore

if TYPE_CHECKING:
    from scalelab.orchestrator.ledger.records import TrialRecord


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
        client.set_tag(self.parent_id, f"{Tag.DRIVER_PREFIX}{_tag_safe(self.driver_id)}", beat)

    def driver_alive(self, driver_id: str | None, parent_tags: dict[str, str]) -> bool:
        if driver_id is None:
            return False
        if driver_id == self.driver_id:
            return True
        raw = parent_tags.get(f"{Tag.DRIVER_PREFIX}{_tag_safe(driver_id)}")
        if raw is None:
            return False
        beat = json.loads(raw)
        if beat["host"] == socket.gethostname() and not _pid_alive(beat["pid"]):
            return False
        return time.time() - beat["t"] < self.lease_s

    def live_drivers(self, parent_tags: dict[str, str]) -> list[str]:
        """The drivers of this sweep whose heartbeat is fresh (other than this one)."""
        live = []
        for key, raw in parent_tags.items():
            if not key.startswith(Tag.DRIVER_PREFIX) or key.endswith(_tag_safe(self.driver_id)):
                continue
            beat = json.loads(raw)
            if beat["host"] == socket.gethostname() and not _pid_alive(beat["pid"]):
                continue
            if time.time() - beat["t"] < self.lease_s:
                live.append(key.removeprefix(Tag.DRIVER_PREFIX))
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


def _tag_safe(driver_id: str) -> str:
    return driver_id.replace(":", "_")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
