"""Synthetic copy and sort tasks of the TSA paper, as next-token prediction (numpy only).

One example is `source SEP answer`: n = 10 source symbols drawn uniformly from the
vocabulary's symbols 1 .. V-1 (V = 32), the separator 0, then the answer: the source itself
(copy) or the source sorted ascending (sort). The model reads the first 2n tokens and
predicts the next one at every position; the loss is on the target half only, i.e. on the
n positions whose next token is an answer symbol, and every other target is -100 (the
ignore_index of torch's cross-entropy).
"""

from __future__ import annotations

from typing import Literal

import numpy as np

SEP = 0
IGNORE = -100
Task = Literal["copy", "sort"]


def sequence_task_batch(
    task: Task,
    batch_size: int,
    rng: np.random.Generator,
    seq_len: int = 10,
    vocab_size: int = 32,
) -> tuple[np.ndarray, np.ndarray]:
    """(inputs, targets), both int64 of shape (batch_size, 2 * seq_len).

    inputs[:, t] is token t of `source SEP answer`; targets[:, t] is token t + 1 where that
    token belongs to the answer, else -100.
    """
    if task not in ("copy", "sort"):
        raise ValueError(f"unknown task {task!r}; allowed: 'copy', 'sort'")
    if vocab_size < 3 or seq_len < 1:
        raise ValueError("need vocab_size >= 3 and seq_len >= 1")
    source = rng.integers(1, vocab_size, size=(batch_size, seq_len), dtype=np.int64)
    answer = source if task == "copy" else np.sort(source, axis=1)
    sep = np.full((batch_size, 1), SEP, dtype=np.int64)
    sequence = np.concatenate([source, sep, answer], axis=1)  # (B, 2n + 1)
    inputs, targets = sequence[:, :-1], sequence[:, 1:].copy()
    targets[:, :seq_len] = IGNORE  # predicting source symbols or SEP: no loss
    return np.ascontiguousarray(inputs), targets


def answer_accuracy(predictions: np.ndarray, targets: np.ndarray) -> float:
    """Share of answer positions (targets != -100) predicted exactly."""
    mask = targets != IGNORE
    return float((predictions[mask] == targets[mask]).mean())
