"""The mode a trained model is evaluated in, and what it executed (docs/evaluation.md).

`inference` (the default) is each mechanism's inference path: TSA's binary gates (a halted
token skips its block, `sparse_inference`) and BudgetFormer's hard top-k heads. `soft` is
the training-time function without its noise or dropout: TSA's soft gates g = 1 - p and
BudgetFormer's soft top-k mask at the end of its temperature schedule (every head computed,
scaled by its mask). Hooks on the routers and budget nets record, over the real tokens of
every forward, TSA's α (the active fraction of routed token-layers, as `tsa/alpha` is
defined) and BudgetFormer's heads per token, k = max(1, floor(s H)), so the scores can be
reported next to what produced them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import Tensor, nn

from scalelab.models.budget_layers import BudgetAttention
from scalelab.models.tsa_layers import TokenSelectiveDepth

Mode = Literal["inference", "soft"]
MODES: tuple[str, ...] = ("inference", "soft")


def set_mode(model: nn.Module, mode: Mode) -> None:
    """Put a trained model (any variant) in `mode`, in place."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    model.eval()
    if isinstance(model.depth, TokenSelectiveDepth):
        model.depth.sparse_inference = mode == "inference"
    for m in model.modules():
        if isinstance(m, BudgetAttention) and mode == "soft":
            # BudgetFormer's soft mask is its training path: that module alone in training
            # mode, without attention dropout; under no_grad it draws no Gumbel noise
            m.training = True
            m.dropout = 0.0


@dataclass
class Executed:
    """Sums over the real tokens of the forwards run since `attach` (see module doc)."""

    mode: str
    mask: Tensor | None = None  # (B, T) real tokens of the forward about to run; None: all
    gate_sum: float = 0.0
    gate_count: int = 0
    heads_sum: float = 0.0
    heads_count: int = 0
    n_head: int = 0
    threshold: float | None = None
    handles: list = field(default_factory=list)

    @classmethod
    def attach(cls, model: nn.Module, mode: Mode) -> Executed:
        rec = cls(mode=mode, n_head=model.cfg.n_head)
        if isinstance(model.depth, TokenSelectiveDepth):
            rec.threshold = model.depth.threshold
            for router in model.depth.routers:
                rec.handles.append(router.register_forward_hook(rec._on_router))
        for m in model.modules():
            if isinstance(m, BudgetAttention):
                rec.handles.append(m.budget_net.register_forward_hook(rec._on_budget))
        return rec

    def _real(self, values: Tensor) -> Tensor:
        if self.mask is None or self.mask.shape != values.shape:
            return values.reshape(-1)
        return values[self.mask]

    def _on_router(self, module: nn.Module, args: tuple, p: Tensor) -> None:
        gate = (p <= self.threshold).float() if self.mode == "inference" else 1.0 - p.float()
        gate = self._real(gate)
        self.gate_sum += float(gate.sum())
        self.gate_count += gate.numel()

    def _on_budget(self, module: nn.Module, args: tuple, out: Tensor) -> None:
        s = torch.sigmoid(out.squeeze(-1).float())
        k = torch.floor(s * self.n_head).clamp(1, self.n_head)
        k = self._real(k)
        self.heads_sum += float(k.sum())
        self.heads_count += k.numel()

    def summary(self) -> dict[str, float | str]:
        """What ran: the mode, TSA's α and BudgetFormer's mean heads (where present)."""
        out: dict[str, float | str] = {"mode": self.mode}
        if self.gate_count:
            out["tsa_alpha"] = self.gate_sum / self.gate_count
        if self.heads_count:
            heads = self.heads_sum / self.heads_count
            out["budget_heads"] = heads
            out["budget_heads_fraction"] = heads / self.n_head
        return out

    def reset(self) -> None:
        self.gate_sum = self.heads_sum = 0.0
        self.gate_count = self.heads_count = 0

    def detach(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles.clear()
