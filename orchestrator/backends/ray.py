"""ray: an existing Ray cluster by address (e.g. one started by `ray up cluster.yaml` on a
cloud, whose autoscaler adds GPU nodes as trials ask for `gpus_per_trial`)."""

from __future__ import annotations

from scalelab.orchestrator.backends.base import Backend, ray_init


class RayClusterBackend(Backend):
    kind = "ray"

    def start(self) -> None:
        self.owns_ray = ray_init(self.cfg.address, embedded=False)
