"""What a trial's placement asks of the node it runs on, as the orchestrator tells the job
(docs/architecture.md, 'The contract'): environment variables that `jobs.launch.launch`
sets around the job, so every launcher's ranks inherit them.

A job started without them (`scalelab train`, a test) asks for nothing and uses what the
node has; a job that was asked for GPUs refuses to start without them
(`jobs.training.devices.check_devices`) instead of training on the CPU.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

GPUS_PER_NODE_ENV = "SCALELAB_GPUS_PER_NODE"  # GPUs the placement gives each node of the trial
GPU_ENV = "SCALELAB_GPU"  # backend.gpu: the GPU model the plan assumed


@dataclass(frozen=True)
class DeviceAsk:
    """GPUs per node (0: none by count) and the GPU model named by the sweep (None: any)."""

    gpus_per_node: int = 0
    gpu: str | None = None

    @property
    def wants_cuda(self) -> bool:
        return self.gpus_per_node > 0 or self.gpu is not None

    def environ(self) -> dict[str, str]:
        """The variables that carry it to the job ('' where nothing is asked, so a value a
        process inherited does not count)."""
        return {GPUS_PER_NODE_ENV: str(self.gpus_per_node or ""), GPU_ENV: self.gpu or ""}

    @classmethod
    def from_environ(cls, env: Mapping[str, str] = os.environ) -> DeviceAsk:
        count = env.get(GPUS_PER_NODE_ENV, "").strip()
        return cls(int(count) if count.isdigit() else 0, env.get(GPU_ENV) or None)
