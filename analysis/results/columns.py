"""The trials table's columns: the backbone's, then each registered mechanism's declared
columns (models/catalog.py), then any other final value of a mechanism's or early exit's
curves that a sweep logged (and the tasks scored while training)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from scalelab.contract.runs import Metric

if TYPE_CHECKING:
    import pyarrow as pa

Kind = str  # "int" | "float" | "str"
# Key config fields of the backbone: (column, path in the JobConfig, type)
BACKBONE_COLUMNS: tuple[tuple[str, tuple[str, ...], Kind], ...] = (
    ("seed", ("seed",), "int"),
    ("task", ("model", "task"), "str"),
    ("n_layer", ("model", "n_layer"), "int"),
    ("d_model", ("model", "d_model"), "int"),
    ("n_head", ("model", "n_head"), "int"),
    ("lr", ("train", "lr"), "float"),
    ("seq_len", ("data", "seq_len"), "int"),
    ("data_source", ("data", "source"), "str"),
    ("budget_flops", ("train", "flops"), "float"),  # the nominal (IsoFLOP) budget, if any
)
CASTS = {"int": int, "float": float, "str": str}


def summary_column(metric: str) -> str:
    return metric.replace("/", "_").replace("@", "_at_")


def summary_prefixes() -> tuple[str, ...]:
    """Curves whose final values become columns even when no mechanism declares them."""
    from scalelab.models import catalog

    return (*catalog.metric_prefixes(), Metric.EARLY_EXIT_PREFIX, Metric.IN_LOOP_PREFIX)


def config_columns() -> list[tuple[str, Kind]]:
    """Every column read from a trial's config or its curves' final values, in order."""
    from scalelab.models import catalog

    out = [(name, kind) for name, _, kind in BACKBONE_COLUMNS[:1]]
    out.append(("attn_out", "str"))
    out += [(name, kind) for name, _, kind in BACKBONE_COLUMNS[1:]]
    out += [(c.name, c.kind) for _, c in catalog.columns()]
    return out


def trials_schema(extra: list[str]) -> pa.Schema:
    import pyarrow as pa

    types = {"int": pa.int64(), "float": pa.float64(), "str": pa.string()}
    fields = [
        ("trial_id", pa.string()),
        ("name", pa.string()),  # the run name, as `status` and MLflow show it
        ("run_id", pa.string()),
        ("variant", pa.string()),
        ("size", pa.string()),
        ("status", pa.string()),
        ("reason", pa.string()),
        ("n_params", pa.int64()),
        ("n_nonembed", pa.int64()),
        ("steps", pa.int64()),
        ("tokens", pa.int64()),
        ("flops", pa.float64()),
        ("final_val_loss", pa.float64()),
        ("best_val_loss", pa.float64()),
        ("wall_time_s", pa.float64()),  # run time and queue time: contract/trial_time.py
        ("queued_s", pa.float64()),
        ("backend", pa.string()),
        ("code_version", pa.string()),
        ("curves_source", pa.string()),
        ("branched_from", pa.string()),  # "<trunk trial id>@<step>": a wsd cooldown branch
        ("stage", pa.string()),  # a sweep with `tune:`: tune, ladder, tune+ladder
    ]
    fields += [(name, types[kind]) for name, kind in config_columns()]
    fields += [(c, pa.float64()) for c in extra]
    fields.append(("config", pa.string()))  # the whole JobConfig as JSON
    return pa.schema(fields)


def config_values(job: dict[str, Any], last: dict[str, float]) -> dict[str, Any]:
    """The config and summary columns of one trial: `job` is its JobConfig as a dict (any
    version of it), `last` the final value of each curve."""
    from scalelab.models import catalog
    from scalelab.models.mechanism import DENSE, Seam

    model = job.get("model") if isinstance(job.get("model"), dict) else {}
    row = {name: _cast(value_at(job, where), kind) for name, where, kind in BACKBONE_COLUMNS}
    mixing = [m.name for m in catalog.mechanisms() if m.seam is Seam.OUTPUT_MIXING]
    active = [n for n in mixing if model.get(n) is not None]
    row["attn_out"] = active[0] if active else model.get("attn_out") or DENSE  # older job.json
    for mechanism, column in catalog.columns():
        kind, _, name = column.source.partition(":")
        if kind == "config":
            value = value_at(model, (mechanism.name, name))
        else:
            value = last.get(name)
        row[column.name] = _cast(value, column.kind)
    for metric, value in last.items():
        if metric.startswith(summary_prefixes()):
            row.setdefault(summary_column(metric), value)
    return row


def _cast(value: Any, kind: Kind) -> Any:
    return None if value is None else CASTS[kind](value)


def value_at(tree: dict[str, Any], where: tuple[str, ...]) -> Any:
    """The value at a key path of nested dicts, None where the path ends early."""
    node: Any = tree
    for key in where:
        if not isinstance(node, dict):
            return None
        node = node.get(key)
    return node
