"""The training metrics of the steps since the last host sync, kept on the device.

The step loop reads nothing back from the device between log points (a host read waits for
every queued kernel and stalls a GPU's pipeline): each micro-batch's losses and metrics are
added into device tensors, each step's train/loss is kept apart (the divergence check needs
every step's), and at a sync step one all-reduce and one device-to-host copy bring back the
window's means and each step's loss.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from scalelab.models.context import ModelOutput

LOSS = "train/loss"


@dataclass(frozen=True)
class Reduced:
    """A window's numbers, averaged over micro-batches and ranks."""

    first_step: int
    means: dict[str, float]  # over the window's steps
    step_losses: list[float]  # train/loss of each step, from first_step on

    @property
    def steps(self) -> int:
        return len(self.step_losses)


class MetricWindow:
    def __init__(self, micro_batches: int, first_step: int) -> None:
        self.micro, self.first_step = micro_batches, first_step
        self.sums: dict[str, torch.Tensor] = {}  # over micro-batches and steps
        self.step_losses: list[torch.Tensor] = []
        self._loss: torch.Tensor | None = None  # this step's train/loss, summed

    def add(self, out: ModelOutput) -> None:
        """One micro-batch's losses and metrics (no host sync)."""
        task = out.task_loss.detach().float()
        self._loss = task if self._loss is None else self._loss + task
        self._add(LOSS, task)
        self._add("train/total_loss", out.loss)
        for name, value in out.metrics.items():
            self._add(name, value)
        for name, value in out.aux_losses.items():
            self._add(f"aux/{name}", value)

    def end_step(self) -> None:
        self.step_losses.append(self._loss)
        self._loss = None

    def reduce(self, world_size: int) -> Reduced:
        """The host sync: means over micro-batches, steps and ranks (names are the same on
        every rank: one model) and each step's loss."""
        names, steps = list(self.sums), len(self.step_losses)
        vec = torch.cat([
            torch.stack([self.sums[k] for k in names]) / (self.micro * steps),
            torch.stack(self.step_losses) / self.micro,
        ])  # fmt: skip
        if world_size > 1:
            dist.all_reduce(vec)
            vec /= world_size
        host = vec.cpu().tolist()
        return Reduced(
            first_step=self.first_step,
            means=dict(zip(names, host[: len(names)], strict=True)),
            step_losses=host[len(names) :],
        )

    def _add(self, name: str, value: torch.Tensor) -> None:
        value = value.detach().float()
        self.sums[name] = self.sums[name] + value if name in self.sums else value
