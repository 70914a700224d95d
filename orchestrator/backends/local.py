"""local: trials on this machine through an embedded Ray (CPU, or the local GPUs).

`ray.init(address='local')` always starts a fresh cluster (a plain `ray.init()` after
`ray stop` tries to join the dead one). Inside a Ray job (`submit --detach`) RAY_ADDRESS
is set and the driver joins that cluster instead.
"""

from __future__ import annotations

import os
from typing import ClassVar, Literal

from scalelab.orchestrator.backends.base import Backend, RayTaskOptions, ray_init


class LocalOptions(RayTaskOptions):
    """`backend: {kind: local, ...}` (the default): the keys every backend takes, and Ray's
    custom resources."""

    kind: Literal["local"] = "local"

    trials_run_here: ClassVar[bool] = True


class LocalBackend(Backend):
    kind = "local"
    options = LocalOptions

    def start(self) -> None:
        address = os.environ.get("RAY_ADDRESS") or "local"
        self.owns_ray = ray_init(address, embedded=True, workers=self.cfg.concurrency)
