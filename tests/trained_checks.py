"""Checks on a trained trial's checkpoint as inference loads it (jobs/training/trained_model.py)."""

from __future__ import annotations

import torch

from scalelab.jobs.config import JobConfig


@torch.no_grad()
def checkpoint_val_loss(job: JobConfig) -> float:
    """The task loss over the trial's fixed validation set of the model that `scalelab
    generate` builds from the trial's newest checkpoint (the trial must have prepared its
    data in $SCALELAB_HOME)."""
    from scalelab.jobs.data.device_inputs import model_inputs
    from scalelab.jobs.data.reader import val_batches
    from scalelab.jobs.data.trial import open_data, prepare
    from scalelab.jobs.training.train import _train_windows
    from scalelab.jobs.training.trained_model import load_model, locate

    model = load_model(locate(job.trial_id))
    windows = _train_windows(job)
    data = open_data(job.data, job.seed, prepare(job.data, job.seed, job.model, windows),
                     job.model, windows)  # fmt: skip
    total, count = 0.0, 0
    for batch in val_batches(data, job.data.val_tokens, job.data.seq_len, 8, 0, 1):
        x, y, kw = model_inputs(batch, "cpu")
        n = int((y != -100).sum())
        total += float(model(x, y, **kw).task_loss) * n
        count += n
    return total / count
