"""Queries over the results tables with pyarrow compute.

`--where` takes a small, safe expression language parsed with Python's `ast` (never
evaluated): column comparisons (==, !=, <, <=, >, >=, chained), `in` / `not in` lists,
`is None`, `and` / `or` / `not`, parentheses; literals are numbers, strings, True/False/None.
Given the table's schema (`filter_table`), each literal is compared in its column's own
type: exactly on integer columns beyond 2^24 and 2^53 (`tokens >= 1e9`), on float columns
against integers a double cannot hold, as 0/1 on bool columns; text against a number is a
clear error.

    variant == 'dense' and size in ['nano', 'micro']
    1e15 <= flops < 1e18 and not (tsa_lambda is None)

`at` picks a curve metric's value per trial: 'final' (its last step), or interpolated at
'flops=1e18', 'tokens=2e9' or 'step=500' (linearly in log x for flops/tokens; null outside
the trial's range, never extrapolated: a ResultsWarning says how many trials have none).
With `group_by`, `n` counts the values the statistics are over (trials without a value at
`at` are not counted), or the trials when there is no `value` column. A filter that keeps
no row warns too.

Why one module: the `--where` language is parsed against the table it filters (each literal
in its column's type), so the parser and the queries that use it stay together.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scalelab.analysis.results import tables
from scalelab.analysis.results.tables import ResultsError

from .where_types import typed as _typed

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.compute as pc


class ResultsWarning(UserWarning):
    """A query that ran but whose answer is likely not what was meant (empty, no values)."""


AT_AXES = ("flops", "tokens", "step")
DEFAULT_METRIC = "val/loss"
TRIAL_AGGREGATES = ("final_val_loss", "best_val_loss", "n_params", "tokens", "flops", "wall_time_s")

MAX_WHERE_CHARS = 10_000
MAX_WHERE_DEPTH = 100
TOO_DEEP = f"--where: nested deeper than {MAX_WHERE_DEPTH} levels of not / and / or / parentheses"

_COMPARE = {
    ast.Eq: "equal",
    ast.NotEq: "not_equal",
    ast.Lt: "less",
    ast.LtE: "less_equal",
    ast.Gt: "greater",
    ast.GtE: "greater_equal",
}


def _parse(text: str) -> ast.Expression:
    """Python's parser on a bounded input: its recursion and memory grow with nesting."""
    if len(text) > MAX_WHERE_CHARS:
        raise ResultsError(f"--where: longer than {MAX_WHERE_CHARS:,} characters")
    try:
        return ast.parse(text.strip(), mode="eval")
    except SyntaxError as e:
        raise ResultsError(f"--where {text!r}: not a valid expression ({e.msg})") from None
    except UnicodeEncodeError:  # a command line's byte that is not UTF-8 (surrogate escape)
        raise ResultsError("--where: not UTF-8 text") from None
    except ValueError as e:  # an integer of more than 4,300 digits
        raise ResultsError(f"--where: {e}") from None
    except (RecursionError, MemoryError):
        raise ResultsError(TOO_DEEP) from None


def parse_where(text: str, columns: Sequence[str] | pa.Schema) -> pc.Expression:
    """`text` -> a pyarrow compute expression over `columns` (ResultsError when invalid).
    With a schema, literals take their column's type (module doc); with names only, they
    keep Python's (pyarrow then casts, and fails on int64 columns beyond 2^24)."""
    return _expr(_parse(text).body, text, _Columns(columns))


class _Columns:
    """The columns a --where may name, with their types when a schema gave them."""

    def __init__(self, columns: Sequence[str] | pa.Schema) -> None:
        names = list(columns.names if hasattr(columns, "names") else columns)
        types = list(columns.types) if hasattr(columns, "types") else [None] * len(names)
        self.types: dict[str, pa.DataType | None] = dict(zip(names, types, strict=True))

    def __contains__(self, name: str) -> bool:
        return name in self.types

    def __iter__(self) -> Iterator[str]:
        return iter(self.types)


def _expr(node: ast.AST, text: str, columns: _Columns, depth: int = 0) -> pc.Expression:
    if depth > MAX_WHERE_DEPTH:
        raise ResultsError(TOO_DEEP)
    if isinstance(node, ast.BoolOp):
        parts = [_expr(v, text, columns, depth + 1) for v in node.values]
        out = parts[0]
        for p in parts[1:]:
            out = (out & p) if isinstance(node.op, ast.And) else (out | p)
        return out
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return ~_expr(node.operand, text, columns, depth + 1)
    if isinstance(node, ast.Compare):
        terms = [node.left, *node.comparators]
        out = None
        for left, op, right in zip(terms, node.ops, terms[1:], strict=False):
            e = _compare(left, op, right, text, columns)
            out = e if out is None else out & e
        return out
    if isinstance(node, ast.Name):  # a bare boolean column
        return _field(node, text, columns)
    raise ResultsError(
        f"--where {text!r}: unsupported {type(node).__name__} at "
        f"{ast.get_source_segment(text, node) or '?'!r}; use comparisons joined by and/or/not"
    )


def _field(node: ast.AST, text: str, columns: _Columns) -> pc.Expression:
    import pyarrow.compute as pc

    if not isinstance(node, ast.Name):
        raise ResultsError(
            f"--where {text!r}: expected a column name, got "
            f"{ast.get_source_segment(text, node) or type(node).__name__!r}"
        )
    if node.id not in columns:
        raise ResultsError(
            f"--where {text!r}: unknown column {node.id!r} (columns: {', '.join(columns)})"
        )
    return pc.field(node.id)


def _literal(node: ast.AST, text: str) -> Any:
    negative, literal = False, node
    while isinstance(literal, ast.UnaryOp) and isinstance(literal.op, ast.USub):
        negative, literal = not negative, literal.operand  # a loop: -(-(-1)) nests
    if isinstance(literal, ast.Constant) and isinstance(
        literal.value, (int, float, str, bool, type(None))
    ):
        value = literal.value
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if isinstance(value, int) and number and not -(2**63) <= value < 2**63:
            raise ResultsError(f"--where: {value:.3g} is outside the 64-bit integer range")
        if literal is node or number:
            return -value if negative else value
    raise ResultsError(
        f"--where {text!r}: expected a literal (number, 'string', True/False/None), got "
        f"{ast.get_source_segment(text, node) or type(node).__name__!r}"
    )


def _compare(
    left: ast.AST, op: ast.cmpop, right: ast.AST, text: str, columns: _Columns
) -> pc.Expression:
    if isinstance(op, (ast.In, ast.NotIn)):
        if not isinstance(right, (ast.List, ast.Tuple, ast.Set)):
            raise ResultsError(
                f"--where {text!r}: 'in' needs a list, e.g. size in ['nano', 'micro']"
            )
        field = _field(left, text, columns)
        values = [_literal(v, text) for v in right.elts]
        e = _typed(columns.types[left.id], left.id, text).isin(field, values)
        return ~e if isinstance(op, ast.NotIn) else e
    if isinstance(op, (ast.Is, ast.IsNot)):
        if _literal(right, text) is not None:
            raise ResultsError(f"--where {text!r}: 'is' only compares with None")
        e = _field(left, text, columns).is_null(nan_is_null=True)
        return ~e if isinstance(op, ast.IsNot) else e
    if type(op) not in _COMPARE:
        raise ResultsError(f"--where {text!r}: unsupported operator {type(op).__name__}")
    func = _COMPARE[type(op)]
    if not isinstance(left, ast.Name):  # a literal on the left (1e15 <= flops): flip it
        left, right, func = right, left, _FLIPPED.get(func, func)
    field = _field(left, text, columns)
    return _typed(columns.types[left.id], left.id, text).compare(field, func, _literal(right, text))


_FLIPPED = {
    "less": "greater",
    "less_equal": "greater_equal",
    "greater": "less",
    "greater_equal": "less_equal",
}


def parse_at(at: str) -> tuple[str, float | None]:
    """'final' -> ('final', None); 'flops=1e18' -> ('flops', 1e18)."""
    text = (at or "final").strip()
    if text == "final":
        return "final", None
    axis, sep, value = text.partition("=")
    axis = axis.strip()
    try:
        x = float(value)
    except ValueError:
        x = math.nan
    if not sep or axis not in AT_AXES or not math.isfinite(x) or x < 0:
        raise ResultsError(
            f"--at {at!r}: expected 'final' or AXIS=VALUE with AXIS in {', '.join(AT_AXES)} "
            "and a non-negative number, e.g. flops=1e18"
        )
    return axis, x


def metric_at(curves: pa.Table, metric: str, at: str = "final") -> pa.Table:
    """(trial_id, value) of `metric` per trial at `at` (see the module doc)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    axis, x = parse_at(at)
    sel = curves.filter(pc.equal(curves["metric"], metric))
    if sel.num_rows == 0:
        names = sorted(set(curves["metric"].unique().cast(pa.string()).to_pylist()))
        raise ResultsError(f"no curve metric {metric!r} (metrics: {', '.join(names) or 'none'})")
    # sort_by does not take dictionary columns: sort on the ids as plain strings
    order = pc.sort_indices(
        pa.table({"t": sel["trial_id"].cast(pa.string()), "s": sel["step"]}),
        sort_keys=[("t", "ascending"), ("s", "ascending")],
    )
    sel = sel.take(order)
    tid = sel["trial_id"].combine_chunks()
    tid = tid if pa.types.is_dictionary(tid.type) else tid.dictionary_encode()
    codes = tid.indices.to_numpy()
    starts = np.flatnonzero(np.r_[True, codes[1:] != codes[:-1]])
    ends = np.r_[starts[1:], codes.size]
    values = sel["value"].to_numpy()
    ids = tid.dictionary.take(pa.array(codes[starts])).cast(pa.string())
    if axis == "final":
        return pa.table({"trial_id": ids, "value": values[ends - 1]})
    xs = sel[axis].to_numpy().astype(float)
    log = axis != "step"
    out = np.full(starts.size, np.nan)
    for i, (a, b) in enumerate(zip(starts, ends, strict=True)):
        gx, gy = xs[a:b], values[a:b]
        if gx.size == 0 or not gx[0] <= x <= gx[-1]:
            continue
        if log:
            ok = gx > 0
            if not ok.any() or x <= 0:
                continue
            out[i] = np.interp(np.log(x), np.log(gx[ok]), gy[ok])
        else:
            out[i] = np.interp(x, gx, gy)
    return pa.table({"trial_id": ids, "value": pa.array(out, from_pandas=True)})


def load(sweep: str, kind: str = tables.TRIALS, root: Path | None = None) -> pa.Table:
    """A synced table of the sweep (ResultsError if the sweep was never synced)."""
    table = tables.read_table(kind, sweep, root)
    if table is None:
        raise ResultsError(
            f"sweep {sweep!r} has no results tables yet: run `scalelab results sync {sweep}`"
        )
    return table


def trials_where(sweep: str, where: str | None, root: Path | None = None) -> pa.Table:
    """The sweep's trials that `where` keeps (all of them without one); ResultsError when
    it keeps none."""
    table = load(sweep, tables.TRIALS, root)
    if where:
        table = filter_table(table, where)
        if table.num_rows == 0:
            raise ResultsError(f"--where {where!r}: no trial of sweep {sweep!r} matches")
    return table


def query(
    sweep: str,
    where: str | None = None,
    group_by: list[str] | None = None,
    metric: str | None = None,
    at: str = "final",
    *,
    table: str = tables.TRIALS,
    root: Path | None = None,
) -> pa.Table:
    """Filter and aggregate one sweep's results (a pyarrow Table, for notebooks too).

    table='trials' (default): one row per trial; with `metric` (or an `at` other than
    'final', which implies val/loss) a `value` column holds that metric at `at`.
    table='curves': one row per curve point, with the trial columns that `where` and
    `group_by` name joined on. With `group_by`, rows become groups with `n` and
    mean/std/min/max of `value` (or of the trials' losses, sizes and compute)."""
    trials = load(sweep, tables.TRIALS, root)
    group_by = list(group_by or [])
    if table == tables.CURVES:
        result = _curves_rows(sweep, trials, where, group_by, metric, at, root)
    elif table == tables.TRIALS:
        result = trials
        if metric is not None or parse_at(at)[0] != "final":
            curves = load(sweep, tables.CURVES, root)
            values = metric_at(curves, metric or DEFAULT_METRIC, at)
            result = result.join(values, "trial_id", join_type="left outer")
        if where:
            result = filter_table(result, where)
            if result.num_rows == 0:
                _warn(f"--where {where!r} matches no trial")
        if "value" in result.column_names and result.num_rows:
            _warn_missing(result["value"].null_count, result.num_rows, metric, at)
    else:
        raise ResultsError(f"unknown table {table!r}: expected trials or curves")
    if group_by:
        missing = [c for c in group_by if c not in result.column_names]
        if missing:
            raise ResultsError(
                f"--group-by: unknown column(s) {', '.join(missing)} "
                f"(columns: {', '.join(result.column_names)})"
            )
        result = _aggregate(result, group_by)
    elif table == tables.TRIALS:
        order = [c for c in ("variant", "n_params", "trial_id") if c in result.column_names]
        result = result.sort_by([(c, "ascending") for c in order])
    return result


def _warn(message: str) -> None:
    import warnings

    warnings.warn(message, ResultsWarning, stacklevel=3)


def _warn_missing(missing: int, rows: int, metric: str | None, at: str) -> None:
    if not missing:
        return
    where = "at their end" if parse_at(at)[0] == "final" else f"at {at}"
    whose = "no trial has" if missing == rows else f"{missing} of {rows} trials have no"
    _warn(
        f"{whose} {metric or DEFAULT_METRIC} {where} (curves are not extrapolated beyond a "
        "trial's own range): their value is empty"
    )


def filter_table(table: pa.Table, where: str) -> pa.Table:
    """The rows of `table` that `where` keeps, each literal compared in its column's type
    (module doc); ResultsError, in one line, when the filter cannot run."""
    import pyarrow as pa

    expr = parse_where(where, table.schema)
    try:
        return table.filter(expr)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
        raise ResultsError(f"--where {where!r}: {str(e).splitlines()[0]}") from None


def _curves_rows(
    sweep: str,
    trials: pa.Table,
    where: str | None,
    group_by: list[str],
    metric: str | None,
    at: str,
    root: Path | None,
) -> pa.Table:
    import pyarrow.compute as pc

    if parse_at(at)[0] != "final":
        raise ResultsError("--at applies to the trials table; curves rows are every point")
    wanted = set(group_by)
    if where:
        wanted |= {n.id for n in ast.walk(_parse(where)) if isinstance(n, ast.Name)}
    curve_cols = tables.curves_schema().names
    joined = sorted((wanted & set(trials.column_names)) - set(curve_cols))
    columns = None  # all, for plain row listings
    if group_by:  # read only what the filter, the groups and the aggregate need
        need = (wanted & set(curve_cols)) | {"value"} | ({"trial_id"} if joined else set())
        need |= {"metric"} if metric is not None else set()
        columns = [c for c in curve_cols if c in need]
    curves = tables.read_table(tables.CURVES, sweep, root, columns=columns)
    if curves is None:
        load(sweep, tables.CURVES, root)  # raises the "not synced" error
    if metric is not None:
        curves = curves.filter(pc.equal(curves["metric"], metric))
    for name in joined:
        curves = curves.append_column(name, _per_row(curves["trial_id"], trials, name))
    return filter_table(curves, where) if where else curves


def _per_row(trial_ids: pa.ChunkedArray, trials: pa.Table, column: str) -> pa.ChunkedArray:
    """A trials column spread onto curve rows through the trial_id dictionary: one lookup
    per distinct trial, then an index take (a hash join on 10M string keys costs ~10x)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if not pa.types.is_dictionary(trial_ids.type):
        trial_ids = trial_ids.dictionary_encode()
    trial_ids = trial_ids.unify_dictionaries()
    chunks = []
    for chunk in trial_ids.chunks:
        where = pc.index_in(chunk.dictionary, value_set=trials["trial_id"].combine_chunks())
        values = trials[column].combine_chunks().take(where)
        if pa.types.is_string(values.type):
            enc = values.dictionary_encode()  # distinct values: group-by keys on indices
            chunks.append(
                pa.DictionaryArray.from_arrays(enc.indices.take(chunk.indices), enc.dictionary)
            )
        else:
            chunks.append(values.take(chunk.indices))
    return pa.chunked_array(chunks)


def _aggregate(table: pa.Table, group_by: list[str]) -> pa.Table:
    import pyarrow as pa

    cols = (
        ["value"]
        if "value" in table.column_names
        else [c for c in TRIAL_AGGREGATES if c in table.column_names]
    )
    counted = "value" if "value" in table.column_names else group_by[0]
    aggs: list[tuple[str, str]] = [(counted, "count")]
    for c in cols:
        aggs += (
            [(c, "mean"), (c, "stddev"), (c, "min"), (c, "max")]
            if c == "value" or c.endswith("loss")
            else [(c, "mean")]
        )
    out = table.group_by(group_by).aggregate(aggs)
    out = out.rename_columns([("n" if n == f"{counted}_count" else n) for n in out.column_names])
    for i, f in enumerate(out.schema):  # few rows now: plain strings sort and print
        if pa.types.is_dictionary(f.type):
            out = out.set_column(i, f.name, out[f.name].cast(f.type.value_type))
    return out.sort_by([(c, "ascending") for c in group_by])
