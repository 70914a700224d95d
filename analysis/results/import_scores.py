"""Downstream scores in a file `results import` reads (imports.py; docs/results.md,
"Importing results"): which columns are a task's accuracy, its standard error or its
correct-answer loss, the trials-table column each becomes (`eval_<task>_<metric>`, as
`results sync` names `scalelab eval`'s scores), and the values each may take.

    eval_piqa_acc, acc_piqa            -> eval_piqa_acc            in [0, 1]
    eval_piqa_acc_norm, acc_norm_piqa  -> eval_piqa_acc_norm       in [0, 1]
    eval_piqa_acc_stderr               -> eval_piqa_acc_stderr     >= 0
    eval_piqa_bpb, bpb_piqa            -> eval_piqa_bpb            > 0 (also _nll, _loss)
    eval_lambada_openai_perplexity     -> the same                 >= 1
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import TYPE_CHECKING

from .import_checks import visible

if TYPE_CHECKING:
    import numpy as np

METRICS = ("acc_norm_stderr", "acc_stderr", "acc_norm", "acc", "bpb", "nll", "loss",
           "perplexity")  # longest first: eval_x_acc_norm is acc_norm, never task x_acc  # fmt: skip
_EVAL = re.compile(r"^eval_(?P<task>.+?)_(?P<metric>" + "|".join(METRICS) + r")$")
_SHORT = re.compile(r"^(?P<metric>acc_norm|acc|bpb|nll)_(?P<task>.+)$")


def score_column(name: str) -> str | None:
    """The trials-table column a file's column becomes, or None when it is no score (nor is a
    name with a control character: it would reach the terminal in every table)."""
    key = name.strip().lower()
    if visible(key) != key:
        return None
    m = _EVAL.match(key) or _SHORT.match(key)
    return f"eval_{m['task']}_{m['metric']}" if m else None


# metric -> (lowest, whether the lowest is allowed, highest, the words)
_RANGES = {
    "acc": (0.0, True, 1.0, "an accuracy in [0, 1]"),
    "acc_norm": (0.0, True, 1.0, "an accuracy in [0, 1]"),
    "acc_stderr": (0.0, True, math.inf, "a standard error >= 0"),
    "acc_norm_stderr": (0.0, True, math.inf, "a standard error >= 0"),
    "perplexity": (1.0, True, math.inf, "a perplexity >= 1"),
}
_LOSS = (0.0, False, math.inf, "a loss > 0")


def score_range(column: str) -> tuple[Callable[[np.ndarray], np.ndarray], str]:
    """Which values a score's column may take (finite ones in its range: a function of an
    array), and the words for them."""
    import numpy as np

    low, low_ok, high, expected = _RANGES.get(_EVAL.match(column)["metric"], _LOSS)  # type: ignore[index]

    def ok(x: np.ndarray) -> np.ndarray:
        above = x >= low if low_ok else x > low
        return np.isfinite(x) & above & (x <= high)

    return ok, expected
