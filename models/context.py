"""What flows beside the hidden states through one forward pass."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import NamedTuple

from torch import Tensor


def masked_mean(
    x: Tensor, mask: Tensor | None, dim: int | None = None, keepdim: bool = False
) -> Tensor:
    """The mean of x over `dim` (every dim: None) counting only the entries where `mask`
    (broadcast to x's shape, True = real token) is set; the plain mean without a mask."""
    if mask is None:
        return x.mean() if dim is None else x.mean(dim=dim, keepdim=keepdim)
    weights = mask.to(x.dtype).expand_as(x)
    dims = tuple(range(x.dim())) if dim is None else dim
    total = (x * weights).sum(dim=dims, keepdim=keepdim)
    return total / weights.sum(dim=dims, keepdim=keepdim).clamp_min(1.0)


@dataclass
class ForwardContext:
    """Per-call scratchpad: mechanisms read the schedule position and leave their
    auxiliary losses and metrics here instead of changing the backbone's signature."""

    progress: float = 1.0  # fraction of training done, in [0, 1]; drives schedules
    pad_mask: Tensor | None = None  # (B, T) True for real tokens; encoder only
    readout: Callable[[Tensor], Tensor] | None = None  # hidden -> logits (LM only)
    aux_losses: dict[str, Tensor] = field(default_factory=dict)
    metrics: dict[str, Tensor] = field(default_factory=dict)
    _metric_counts: dict[str, int] = field(default_factory=dict)

    def add_loss(self, name: str, value: Tensor) -> None:
        """Accumulate an auxiliary loss term (summed over layers)."""
        self.aux_losses[name] = self.aux_losses[name] + value if name in self.aux_losses else value

    def add_metric(self, name: str, value: Tensor) -> None:
        """Record a metric; repeated calls (one per layer) are averaged."""
        value = value.detach().float()
        n = self._metric_counts.get(name, 0)
        self.metrics[name] = (
            value if n == 0 else self.metrics[name] + (value - self.metrics[name]) / (n + 1)
        )
        self._metric_counts[name] = n + 1


class ModelOutput(NamedTuple):
    """A tuple, so that DeepSpeed finds the tensors in it: its engine hooks its backward
    prologue (zeroing BF16_Optimizer's bf16 gradients, telling ZeRO whether this micro-batch
    ends the step) onto the tensors a forward returns, looked for only inside tuples, lists
    and dicts (deepspeed.runtime.utils.register_output_backward_hooks). As a dataclass it
    hid them, and the prologue never ran (issue 26; tests/jobs/test_gradient_settings.py)."""

    logits: Tensor
    loss: Tensor | None = None  # task loss + every auxiliary loss
    task_loss: Tensor | None = None
    aux_losses: Mapping[str, Tensor] = MappingProxyType({})
    metrics: Mapping[str, Tensor] = MappingProxyType({})
