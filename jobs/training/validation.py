"""Validation on the fixed validation set, averaged over all ranks' examples: val/loss, and
val/accuracy for the classification encoder."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from scalelab.jobs.data.device_inputs import model_inputs
from scalelab.jobs.data.trial import Batch
from scalelab.jobs.training.distributed import DistEnv


@torch.no_grad()
def evaluate(engine: Any, batches: list[Batch], env: DistEnv, progress: float) -> dict[str, float]:
    """{'val/loss': mean task loss over every target} (+ 'val/accuracy' when classifying),
    plus the model's own metrics in inference mode averaged over the validation batches,
    renamed '<group>/val_<name>' (e.g. tsa/val_alpha: the share of routed token-layers that
    sparse inference actually executed; tsa/alpha is the soft training value)."""
    engine.eval()
    # (sum of losses x targets, targets, correct class predictions, classified examples)
    total = torch.zeros(4, dtype=torch.float64)
    model_metrics: dict[str, float] = {}
    for b in batches:
        x, y, kw = model_inputs(b, env.device)
        out = engine(x, y, progress=progress, **kw)
        for name, value in out.metrics.items():
            model_metrics[name] = model_metrics.get(name, 0.0) + float(value) / len(batches)
        n = int((y != -100).sum())
        total[:2] += torch.tensor([float(out.task_loss) * n, n], dtype=torch.float64)
        if y.dim() == 1:  # class labels: the logits are (B, n_classes)
            total[2] += float((out.logits.argmax(-1) == y).sum())
            total[3] += len(y)
    names = sorted(model_metrics)  # the same on every rank: one model
    total = torch.cat([total, torch.tensor([model_metrics[k] for k in names], dtype=torch.float64)])
    if env.world_size > 1:
        total = total.to(env.device)
        dist.all_reduce(total)
        total = total.cpu()
        total[4:] /= env.world_size
    engine.train()
    metrics = {"val/loss": float(total[0] / total[1].clamp_min(1))}
    for i, name in enumerate(names):
        group, _, rest = name.partition("/")
        metrics[f"{group}/val_{rest}"] = float(total[4 + i])
    if total[3] > 0:
        metrics["val/accuracy"] = float(total[2] / total[3])
    return metrics


# ------------------------------------------------------------------ early-exit baseline


def alpha_tag(alpha: float) -> str:
    """0.726 -> 'a0.726': the suffix of the early-exit metric names ('@' is not allowed)."""
    return f"a{alpha:g}"


@torch.no_grad()
def evaluate_early_exit(
    engine: Any, batches: list[Batch], env: DistEnv, alphas: tuple[float, ...]
) -> dict[str, float]:
    """The trained LM with confidence early exit (models.early_exit) at each target active
    fraction alpha: the threshold is found on rank 0's first validation batch
    (threshold_for_active_fraction) and shared; then the whole validation set is read out
    with it. Metrics per alpha: early_exit/val_loss_a<alpha>, early_exit/alpha_a<alpha> (the
    alpha reached on the validation set), early_exit/tlops_saved_a<alpha>,
    early_exit/threshold_a<alpha>."""
    import deepspeed
    import torch.nn.functional as F

    from scalelab.models.early_exit import early_exit_logits, threshold_for_active_fraction
    from scalelab.models.tsa_counts import tlops_saved

    model = engine.module
    engine.eval()
    metrics: dict[str, float] = {}
    # ZeRO-3 partitions the weights; early exit calls the blocks directly, so gather them
    # (a no-op for unpartitioned parameters).
    with deepspeed.zero.GatheredParameters(list(model.parameters())):
        calib, _, _ = model_inputs(batches[0], env.device)
        for alpha in alphas:
            threshold = torch.tensor(
                threshold_for_active_fraction(model, calib, alpha), dtype=torch.float64
            )
            if env.world_size > 1:  # one threshold for every rank
                threshold = threshold.to(env.device)
                dist.broadcast(threshold, src=0)
            # (sum of losses, targets, sum of alpha x tokens, tokens)
            total = torch.zeros(4, dtype=torch.float64)
            for b in batches:
                x, y, _ = model_inputs(b, env.device)
                out = early_exit_logits(model, x, float(threshold))
                loss = F.cross_entropy(
                    out.logits.flatten(0, 1).float(), y.flatten(), ignore_index=-100,
                    reduction="sum",
                )  # fmt: skip
                total += torch.tensor(
                    [float(loss), int((y != -100).sum()), out.alpha * x.numel(), x.numel()],
                    dtype=torch.float64,
                )
            if env.world_size > 1:
                total = total.to(env.device)
                dist.all_reduce(total)
                total = total.cpu()
            reached = float(total[2] / total[3])
            tag = alpha_tag(alpha)
            metrics[f"early_exit/val_loss_{tag}"] = float(total[0] / total[1].clamp_min(1))
            metrics[f"early_exit/alpha_{tag}"] = reached
            metrics[f"early_exit/tlops_saved_{tag}"] = float(
                tlops_saved(reached, len(model.blocks))
            )
            metrics[f"early_exit/threshold_{tag}"] = float(threshold)
    engine.train()
    return metrics


# ------------------------------------------------------------------ TSA's binary gates


def evaluate_binarised(
    engine: Any, batches: list[Batch], env: DistEnv, progress: float
) -> dict[str, float]:
    """A TSA model validated with soft gates (`sparse_inference: false`, as the paper reports
    its loss and α) read out once more with the binary inference gates: tsa/val_loss_binary
    and tsa/val_alpha_binary (the share of routed token-layers executed). {} for any other
    model, and for TSA whose validation is already binary."""
    from scalelab.models.tsa_layers import TokenSelectiveDepth

    depth = getattr(engine.module, "depth", None)
    if not isinstance(depth, TokenSelectiveDepth) or depth.sparse_inference:
        return {}
    depth.sparse_inference = True
    try:
        binary = evaluate(engine, batches, env, progress)
    finally:
        depth.sparse_inference = False
    return {
        "tsa/val_loss_binary": binary["val/loss"],
        "tsa/val_alpha_binary": binary["tsa/val_alpha"],
    }
