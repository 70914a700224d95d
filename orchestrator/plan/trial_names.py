"""What tells a sweep's trials apart, for people: the settings its axes vary and short,
unique run names built from them (`dense-nano-98k-lr1e-3`).

A trial's identity stays its id (`JobConfig.trial_id`); a name is for the MLflow runs list,
`status` and the plan, where two trials that differ only in `train.lr` must not look alike.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from scalelab.orchestrator.plan.expand import Trial

AXIS_SECTIONS = ("grid", "zip", "isoflop")  # where swept settings come from (not `variants`)
SHOWN_APART = {"model.size"}  # a column and a name part of their own
BUDGET_KEYS = {"train.tokens", "train.flops", "train.tokens_per_param"}  # shown as tokens
PREFIXES = {"train.lr": "lr", "seed": "s"}


def swept_settings(trials: list[Trial]) -> dict[str, dict[str, Any]]:
    """trial id -> {dotted key: value} of the axis settings (grid, zip, isoflop) whose values
    differ between the trials, in axis order; the size is left out (it has its column)."""
    keys: dict[str, None] = {}
    for t in trials:
        for key, value, where in t.settings:
            if where and where[0] in AXIS_SECTIONS and key not in SHOWN_APART and value is not None:
                keys.setdefault(key)
    values = {t.trial_id: _axis_values(t) for t in trials}
    varying = [k for k in keys if len({repr(v.get(k)) for v in values.values()}) > 1]
    return {tid: {k: v[k] for k in varying if k in v} for tid, v in values.items()}


def _axis_values(t: Trial) -> dict[str, Any]:
    return {
        key: value
        for key, value, where in t.settings
        if where and where[0] in AXIS_SECTIONS and value is not None
    }


def run_names(trials: list[Trial]) -> dict[str, str]:
    """trial id -> `variant-size[-tokens][-swept settings]`, unique within the sweep (a
    short trial id is added to names that would still collide)."""
    swept = swept_settings(trials)
    budget_varies = len({t.tokens for t in trials}) > 1
    names = {}
    for t in trials:
        parts = [t.variant, t.size]
        if budget_varies:
            parts.append(short_count(t.tokens))
        parts += [short(k, v) for k, v in swept[t.trial_id].items() if k not in BUDGET_KEYS]
        names[t.trial_id] = "-".join(parts)
    repeated = Counter(names.values())
    return {tid: f"{name}-{tid[:6]}" if repeated[name] > 1 else name for tid, name in names.items()}


def short(key: str, value: Any) -> str:
    """`train.lr`=0.001 -> 'lr1e-3', `seed`=2 -> 's2', `model.budget.k`=2 -> 'k2'."""
    prefix = PREFIXES.get(key, key.rsplit(".", 1)[-1])
    return f"{prefix}{short_value(value)}"


def short_value(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, int):
        return short_count(value)
    if isinstance(value, float):
        text = f"{value:.3g}"
        if "e" in text:  # 1e-03 -> 1e-3
            mantissa, exponent = text.split("e")
            text = f"{mantissa}e{int(exponent)}"
        return text
    if isinstance(value, dict | list):
        return "x".join(
            short_value(v) for v in (value.values() if isinstance(value, dict) else value)
        )
    return str(value)


def short_count(n: int) -> str:
    """98304 -> '98k', 1_500_000 -> '1.5M' (3 significant digits)."""
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g}{unit}"
    return str(n)
