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
from typing import Any

METRICS = ("acc_norm_stderr", "acc_stderr", "acc_norm", "acc", "bpb", "nll", "loss",
           "perplexity")  # longest first: eval_x_acc_norm is acc_norm, never task x_acc  # fmt: skip
_EVAL = re.compile(r"^eval_(?P<task>.+?)_(?P<metric>" + "|".join(METRICS) + r")$")
_SHORT = re.compile(r"^(?P<metric>acc_norm|acc|bpb|nll)_(?P<task>.+)$")


def score_column(name: str) -> str | None:
    """The trials-table column a file's column becomes, or None when it is no score."""
    key = name.strip().lower()
    m = _EVAL.match(key) or _SHORT.match(key)
    return f"eval_{m['task']}_{m['metric']}" if m else None


def score_value(column: str, value: Any) -> float | None:  # noqa: ANN401
    """A score's value as a float, None when empty; ValueError naming what is wrong."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{column} {value!r} is not a number") from None
    metric = _EVAL.match(column)["metric"]  # type: ignore[index]
    ok, expected = {
        "acc": (0 <= x <= 1, "an accuracy in [0, 1]"),
        "acc_norm": (0 <= x <= 1, "an accuracy in [0, 1]"),
        "acc_stderr": (x >= 0, "a standard error >= 0"),
        "acc_norm_stderr": (x >= 0, "a standard error >= 0"),
        "perplexity": (x >= 1, "a perplexity >= 1"),
    }.get(metric, (x > 0, "a loss > 0"))
    if not math.isfinite(x) or not ok:
        raise ValueError(f"{column} {value!r}: expected {expected}")
    return x
