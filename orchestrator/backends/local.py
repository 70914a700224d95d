"""local: trials on this machine through an embedded Ray (CPU, or the local GPUs).

`ray.init(address='local')` always starts a fresh cluster (a plain `ray.init()` after
`ray stop` tries to join the dead one). Inside a Ray job (`submit --detach`) RAY_ADDRESS
is set and the driver joins that cluster instead.
"""

from __future__ import annotations

import os

from scalelab.orchestrator.backends.base import Backend, ray_init


class LocalBackend(Backend):
    kind = "local"

    def start(self) -> None:
        address = os.environ.get("RAY_ADDRESS") or "local"
        self.owns_ray = ray_init(address, embedded=True, workers=self.cfg.concurrency)
