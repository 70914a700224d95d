"""A synced sweep's design, read from its trials' configs: the swept axes that define a
cell, a variant's own swept settings (its arms), and the seed that replicates a cell.

Every science field of the JobConfig (model, data, train) that takes more than one value
across the sweep is a candidate axis, except the keys a variant sets (each
mechanism's, models/catalog.py) and the seed. Fields that follow from the axes already chosen (a
size preset's n_layer, d_model, n_head) are left out, so `model.size` and `train.tokens`
stay the axes of the demo rather than six collinear columns.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa

SCIENCE = ("model", "data", "train")
# Tried first, in this order: the axes users sweep most, so they name the cells.
PRIORITY = ("model.size", "train.tokens", "train.flops", "train.tokens_per_param")
# Config paths that already are columns of the trials table under another name.
EXISTING = {"model.size": "size"}


@dataclass(frozen=True)
class Design:
    table: pa.Table  # the trials, with a column per axis and arm (named by config path)
    axes: tuple[str, ...]
    arms: tuple[str, ...]


def axis_label(name: str) -> str:
    """'train.tokens' -> 'tokens', 'model.tsa.lambda_depth' -> 'tsa.lambda_depth'."""
    for prefix in ("model.", "train.", "data."):
        if name.startswith(prefix):
            return name[len(prefix) :]
    return name


def variant_keys() -> set[str]:
    """The keys a variant sets: every mechanism's, and the older spelling attn_out."""
    from scalelab.models import catalog

    return {"model.attn_out", *(f"model.{m.name}" for m in catalog.mechanisms())}


def read_design(table: pa.Table, per_variant: tuple[str, ...] = ()) -> Design:
    """The cell axes and arms of `table` (module doc); without configs, the swept ones of
    the size, tokens and budget columns. `per_variant`: keys that are a variant's own
    setting here, like the keys a variant sets (a tuned sweep's `train.lr`: each variant
    at its own rate, analysis/results/tuned_gain.py), never a cell axis."""
    import pyarrow as pa

    from scalelab.analysis.scaling import swept_axes

    configs = _configs(table)
    if configs is None:
        return Design(table, tuple(swept_axes(table)), ())
    own = variant_keys() | set(per_variant)
    leaves = [_flatten({k: c.get(k) for k in SCIENCE}) for c in configs]
    keys = sorted({k for leaf in leaves for k in leaf})
    shared = [k for k in keys if not any(k == f or k.startswith(f + ".") for f in own)]
    variants = table["variant"].to_pylist()
    axes = _minimal(shared, leaves, list(range(len(leaves))))
    arms = []
    for k in sorted(set(keys) - set(shared)):
        within = {}
        for v, leaf in zip(variants, leaves, strict=True):
            within.setdefault(v, set()).add(_key(leaf.get(k)))
        if any(len(values) > 1 for values in within.values()):
            arms.append(k)
    out = table
    for name in axes + arms:
        if EXISTING.get(name) in table.column_names:
            continue
        values = [leaf.get(name) for leaf in leaves]
        try:
            array = pa.array(values)
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            array = pa.array([None if v is None else json.dumps(v) for v in values])
        out = out.append_column(name, array)
    return Design(out, tuple(EXISTING.get(a, a) for a in axes), tuple(arms))


def _configs(table: pa.Table) -> list[dict[str, Any]] | None:
    if "config" not in table.column_names or table.num_rows == 0:
        return None
    out = []
    for text in table["config"].to_pylist():
        try:
            config = json.loads(text) if text else None
        except json.JSONDecodeError:
            config = None
        if not isinstance(config, dict):
            return None
        out.append(config)
    return out


def _flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(tree, dict):
        out: dict[str, Any] = {}
        for k, v in tree.items():
            out.update(_flatten(v, f"{prefix}{k}."))
        return out if out or not prefix else {prefix[:-1]: None}
    return {prefix[:-1]: tree}


def _key(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def _minimal(keys: list[str], leaves: list[dict[str, Any]], rows: list[int]) -> list[str]:
    """The size, then the keys (priority first) that each split the rows further than the
    keys before them."""
    order = [k for k in PRIORITY if k in keys] + [k for k in keys if k not in PRIORITY]
    chosen = order[:1] if order[:1] == ["model.size"] else []  # the size names every cell
    groups = len({tuple(_key(leaves[i].get(c)) for c in chosen) for i in rows})
    for k in order:
        if k in chosen:
            continue
        candidate = chosen + [k]
        n = len({tuple(_key(leaves[i].get(c)) for c in candidate) for i in rows})
        if n > groups:
            chosen, groups = candidate, n
    return chosen
