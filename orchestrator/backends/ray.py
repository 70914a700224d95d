"""ray: an existing Ray cluster by address (e.g. one started by `ray up cluster.yaml` on a
cloud, whose autoscaler adds GPU nodes as trials ask for `gpus_per_trial`)."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, model_validator

from scalelab.orchestrator.backends.base import Backend, RayTaskOptions, ray_init


class RayOptions(RayTaskOptions):
    """`backend: {kind: ray, address: ..., ...}`."""

    model_config = ConfigDict(json_schema_extra={"required": ["address"]})

    kind: Literal["ray"] = "ray"
    address: str | None = Field(None, description="ray: cluster address (ray://host:10001)")

    @model_validator(mode="after")
    def _needs_an_address(self) -> RayOptions:
        if not self.address:
            raise ValueError("kind='ray' needs an address (e.g. ray://head:10001 or auto)")
        return self

    def writers_elsewhere(self) -> str | None:
        if self.address == "local":  # a cluster this driver starts, here
            return None
        return f"the trials write it from the nodes of the Ray cluster at {self.address}"


class RayClusterBackend(Backend):
    kind = "ray"
    options = RayOptions

    @classmethod
    def preflight(cls, cfg: RayOptions) -> None:
        ray_init(cfg.address, embedded=False)

    def start(self) -> None:
        self.owns_ray = ray_init(self.cfg.address, embedded=False)
