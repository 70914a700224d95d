"""A synthetic text-classification task whose difficulty varies by example (numpy only).

Token ids: 0 .. C-1 = the class keywords, C .. 2C-1 = the tokens a_i, 2C .. 3C-1 = the
tokens b_j, 3C .. vocab-1 = filler (C = n_classes).

- Easy example of class c: the keyword c is repeated `easy_repeats` times among filler
  tokens. A bag of words (the classifier's mean pool) already reads the label: no attention
  is needed.
- Hard example of class c: one token a_i and one token b_j at random positions among filler,
  with c = (i + j) mod C. The pair, not either token, decides the label, so a bag of words
  (a sum of per-token features) cannot read it for C >= 2: a token has to attend to the
  other one (content-based attention).

`difficulty` (1 = hard, 0 = easy) is returned for analysis (e.g. the budget s per
difficulty), never as a model input.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SyntheticClassification:
    tokens: np.ndarray  # (n, seq_len) int64
    labels: np.ndarray  # (n,) int64 in [0, n_classes)
    difficulty: np.ndarray  # (n,) int64: 1 = hard, 0 = easy
    vocab_size: int
    n_classes: int


def make_classification(
    n: int,
    *,
    seq_len: int = 16,
    n_classes: int = 4,
    vocab_size: int = 32,
    hard_fraction: float = 0.5,
    easy_repeats: int = 4,
    hard_terms: int = 2,
    seed: int = 0,
) -> SyntheticClassification:
    """`n` examples, a `hard_fraction` of them hard, shuffled (see module docstring)."""
    n_filler = vocab_size - (1 + hard_terms) * n_classes
    if n_filler < 1:
        raise ValueError(f"vocab_size={vocab_size} leaves no filler tokens for {n_classes} classes")
    if hard_terms < 2 or hard_terms > seq_len:
        raise ValueError(f"hard_terms={hard_terms} must be in [2, seq_len={seq_len}]")
    if not 2 <= easy_repeats <= seq_len:
        raise ValueError(f"easy_repeats={easy_repeats} must be in [2, seq_len={seq_len}]")
    rng = np.random.default_rng(seed)
    C = n_classes
    tokens = rng.integers((1 + hard_terms) * C, vocab_size, size=(n, seq_len))
    labels = rng.integers(0, C, size=n)
    hard = rng.random(n) < hard_fraction
    for row, c, is_hard in zip(tokens, labels, hard, strict=True):
        if is_hard:
            terms = rng.integers(0, C, size=hard_terms)
            terms[-1] = (c - terms[:-1].sum()) % C
            types = C * np.arange(1, hard_terms + 1)  # the term sets start at C, 2C, ...
            row[rng.choice(seq_len, hard_terms, replace=False)] = types + terms
        else:
            row[rng.choice(seq_len, easy_repeats, replace=False)] = c
    return SyntheticClassification(
        tokens=tokens.astype(np.int64),
        labels=labels.astype(np.int64),
        difficulty=hard.astype(np.int64),
        vocab_size=vocab_size,
        n_classes=n_classes,
    )
