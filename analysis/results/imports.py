"""`scalelab results import FILE --sweep NAME`: points someone else measured (a published
ladder, another framework's runs) as rows of the sweep's `trials` table, so that every
`results` command answers on them without an MLflow run behind them (docs/results.md,
"Importing results").

A file is CSV, Parquet or JSON Lines (by its suffix) with one row per trial: the parameter
count (N), the training tokens (D) or compute (C), and the final loss or a downstream
score (import_scores.py: `eval_<task>_acc`, `acc_<task>`, a correct-answer loss); optionally the
variant, the seed, a size label and a nominal IsoFLOP budget. The file is read within
limits (import_read.py: rows, bytes, columns, JSON depth, all before parsing) and
questioned (import_checks.py: a file, UTF-8 text, no row repeated, C near 6ND), then every
row is checked, a column at a time (import_columns.py), before anything is written; the
problems come back as `FILE:LINE: what is wrong` (Parquet: `FILE:row R`). Text is stored
with its control characters escaped. A row without a size label gets one from N to 3
significant figures, nearly equal N sharing it. Imported rows are marked
`curves_source = "imported"`: importing again replaces the sweep's imported rows (never its
synced ones), and `sync` keeps them. A sweep with trained (synced) trials takes imported
rows only when asked (`join_trained`): they would join its fits.

Why one module: one importer, read top to bottom: read, check, place, label, write; its
readers and checks are the modules beside it (import_read, import_checks, import_columns,
import_scores).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from scalelab.analysis.results import tables
from scalelab.analysis.results.tables import ResultsError
from scalelab.contract.runs import Status

from .import_checks import Duplicates, first_copies, flops_note, rival_note, visible
from .import_columns import Checked, check_rows
from .import_read import MAX_LISTED, ImportLimits, Points, read_points
from .import_scores import score_column

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

IMPORTED = "imported"  # the trials' curves_source: rows no MLflow run stands behind
SIGNIFICANT = 3  # a size label's figures: 73.8M
CLOSE = 1e-3  # N this close (relative) share a size label even across a rounding boundary

# field -> the column names that mean it (compared lower-case)
ALIASES: dict[str, tuple[str, ...]] = {
    "N": ("n", "n_params", "params", "parameters"),
    "D": ("d", "tokens", "n_tokens"),
    "C": ("c", "flops", "compute"),
    "loss": ("loss", "final_val_loss", "val_loss", "final_loss"),
    "variant": ("variant", "group"),
    "seed": ("seed",),
    "size": ("size",),
    "budget": ("budget", "budget_flops"),
    "name": ("name",),
}
_NAMES = {a for aliases in ALIASES.values() for a in aliases}
DEFAULT_VARIANT = "dense"  # the commands' default baseline and forecast variant


@dataclass(frozen=True)
class ImportResult:
    sweep: str
    path: Path
    n_rows: int
    n_replaced: int  # imported rows of the sweep this import replaced
    n_kept: int  # synced rows of the sweep left as they were
    ignored: tuple[str, ...]  # the file's columns no field reads
    trials_path: Path
    notes: tuple[str, ...] = ()  # what the import did that the file did not say

    def __str__(self) -> str:
        text = f"imported {self.n_rows} trials from {self.path} into sweep {self.sweep!r}"
        if self.n_replaced:
            text += f" (replacing its {self.n_replaced} previously imported rows)"
        if self.n_kept:
            text += f"; {self.n_kept} synced trials kept"
        if self.ignored:
            shown = ", ".join(self.ignored[:MAX_LISTED])
            more = len(self.ignored) - MAX_LISTED
            text += f"; ignored columns: {shown}" + (f" and {more} more" if more > 0 else "")
        for note in self.notes:
            text += f"; {note}"
        return visible(f"{text} -> {self.trials_path}")


def import_file(
    path: Path | str, sweep: str, *, root: Path | None = None,
    duplicates: Duplicates | str = Duplicates.REFUSE, wait_s: float | None = None,
    limits: ImportLimits | None = None, join_trained: bool = False,
) -> ImportResult:  # fmt: skip
    """Check every row of `path` and write them as the sweep's imported trials (module doc);
    ResultsError listing each bad line, and nothing written, when any row is wrong.
    `duplicates`: what rows identical in every field read are (import_checks.Duplicates);
    `wait_s`: how long to wait for another writer of the sweep's tables (tables.tables_lock);
    `limits`: what a file may hold (import_read.ImportLimits); `join_trained`: import into
    a sweep that has trained (synced) trials too."""
    import numpy as np

    path, policy = Path(path), Duplicates(duplicates)
    tables.sweep_dir(sweep, root)  # a name no sweep can have fails here, before reading
    points = read_points(path, _wanted, limits or ImportLimits())
    fields, ignored = _fields(list(points.names), path)
    scores = [f for f in fields if f.startswith("eval_")]
    n = points.table.num_rows
    checked = check_rows({f: points.table[c] for f, c in fields.items()}, n, scores)
    good = np.flatnonzero(checked.problem < 0)
    copies, firsts = first_copies(_keys(checked, fields, good))
    copies, firsts = good[copies], good[firsts]
    _refuse_problems(path, points, checked, copies, firsts, policy, n)
    if policy is Duplicates.MERGE:
        good = np.setdiff1d(good, copies)
    rows = _rows(path, points, checked, scores, good)
    notes = (
        _copies_note(len(copies), policy) if len(copies) else None,
        flops_note(checked.ratios[good]),
        rival_note(rows),
    )
    with tables.tables_lock(sweep, root, wait_s):  # the sweep's tables: read, then rewritten
        return _write(sweep, path, rows, tuple(ignored), root,
                      tuple(x for x in notes if x), join_trained)  # fmt: skip


def _wanted(column: str) -> bool:
    """Whether some field reads the column (the others are named, never parsed)."""
    return column.strip().lower() in _NAMES or score_column(column) is not None


def _keys(checked: Checked, fields: dict[str, str], rows: np.ndarray) -> np.ndarray:
    """One row of integers per row in `rows`: its value in every field read (numbers by
    their bits, text by its code), equal exactly when the rows are."""
    import numpy as np
    import pyarrow.compute as pc

    keys = []
    for f in fields:
        if f in checked.numbers:
            keys.append((checked.numbers[f].values[rows] + 0.0).view(np.int64))  # -0 is 0
        else:
            codes = pc.dictionary_encode(checked.texts[f].values.take(rows)).indices
            keys.append(pc.fill_null(codes, -1).to_numpy(zero_copy_only=False).astype(np.int64))
    return np.stack(keys, axis=1) if keys else np.zeros((len(rows), 0), np.int64)


def _refuse_problems(
    path: Path, points: Points, checked: Checked, copies: np.ndarray, firsts: np.ndarray,
    policy: Duplicates, n: int,
) -> None:  # fmt: skip
    """ResultsError listing the rows' problems (the first MAX_LISTED of them, in the file's
    order), the repeated rows among them unless `policy` says what repeats are."""
    import numpy as np

    bad = np.flatnonzero(checked.problem >= 0)
    listed = [(int(i), f"{path}:{points.where(i)}: {checked.words(i)}") for i in bad[:MAX_LISTED]]
    total = len(bad)
    refused = policy is Duplicates.REFUSE and len(copies) > 0
    if refused:
        total += len(copies)
        listed += [(int(j), f"{path}:{points.where(j)}: the same as {_place(points.where(i))} "
                            "in every field read")
                   for j, i in zip(copies[:MAX_LISTED], firsts[:MAX_LISTED], strict=True)]  # fmt: skip
    if n == 0:
        total += 1
        listed.append((0, f"{path}: no rows"))
    if total:
        raise ResultsError(_problems_text(path, listed, total, refused))


def _place(where: str) -> str:
    """'line 12', or for Parquet 'row 12'."""
    return where if where.startswith("row") else f"line {where}"


def _problems_text(path: Path, problems: list[tuple[int, str]], total: int, copies: bool) -> str:
    """The error: the problems in the file's order (the first MAX_LISTED), and what to do
    about rows that repeat another."""
    listed = [p for _, p in sorted(problems, key=lambda p: p[0])][:MAX_LISTED]
    more = total - len(listed)
    listed += [f"... and {more} more"] if more > 0 else []
    if copies:
        listed.append(
            "identical rows: --duplicates merge imports each once, --duplicates keep "
            "imports every copy as a trial of its own"
        )
    head = f"{path}: {total} bad row(s), nothing imported:\n" if total > 1 else ""
    return head + "\n".join(listed)


def _copies_note(n: int, policy: Duplicates) -> str:
    done = "merged (each imported once)" if policy is Duplicates.MERGE else "kept as trials"
    return f"{n} repeated row(s) {done}"


def _fields(names: list[str], path: Path) -> tuple[dict[str, str], list[str]]:
    """field -> the file's column for it; the columns no field reads."""
    fields: dict[str, str] = {}
    for field, aliases in ALIASES.items():
        found = [c for c in names if c.strip().lower() in aliases]
        if len(found) > 1:
            raise ResultsError(f"{path}: columns {', '.join(found)} all mean {field}: keep one")
        if found:
            fields[field] = found[0]
    if "N" not in fields and "size" in fields:
        fields["N"] = fields.pop("size")  # a numeric size is the parameter count
    for c in names:  # downstream scores (import_scores.py), each its own field
        score = score_column(c)
        if score is not None and c not in fields.values():
            if score in fields:
                raise ResultsError(
                    f"{path}: columns {fields[score]}, {c} both mean {score}: keep one"
                )
            fields[score] = c
    scores = any(f.startswith("eval_") for f in fields)
    missing = [
        what
        for what, ok in (
            ("N (n_params, params) or size", "N" in fields),
            ("D (tokens) or C (flops)", "D" in fields or "C" in fields),
            ("loss (final_val_loss, val_loss) or a task's accuracy", "loss" in fields or scores),
        )
        if not ok
    ]
    if missing:
        shown = ", ".join(names[:MAX_LISTED]) + (" ..." if len(names) > MAX_LISTED else "")
        raise ResultsError(
            f"{path}: no column for {'; '.join(missing)} (columns: {shown or 'none'})"
        )
    ignored = [visible(c) for c in names if c not in fields.values()]
    return fields, ignored


def _rows(
    path: Path, points: Points, checked: Checked, scores: list[str], rows: np.ndarray
) -> pa.Table:
    """The trials of the rows `rows` (checked), as the trials table's columns."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    def floats(values: np.ndarray) -> pa.Array:
        return pa.array(values, pa.float64(), mask=np.isnan(values))

    nums, texts = checked.numbers, checked.texts
    n_params = np.rint(nums["N"].values[rows]).astype(np.int64)
    loss = floats(nums["loss"].values[rows])
    name = texts["name"].values.take(rows)
    if name.null_count:  # FILE:LINE, so that every trial points at its line
        name = pc.coalesce(name, points.places(rows, f"{visible(path.name)}:"))
    size = texts["size"].values.take(rows)
    if size.null_count:
        unlabelled = np.asarray(pc.is_null(size))
        distinct, inverse = np.unique(n_params[unlabelled], return_inverse=True)
        named = np.full(len(rows), None, object)
        named[unlabelled] = labelled(distinct)[inverse]
        size = pc.coalesce(size, pa.array(named, pa.string()))
    columns = {
        "name": name,
        "variant": pc.fill_null(texts["variant"].values.take(rows), DEFAULT_VARIANT),
        "size": size,
        "status": pa.array(np.full(len(rows), str(Status.FINISHED), object), pa.string()),
        "n_params": pa.array(n_params),
        "tokens": pa.array(np.rint(checked.tokens[rows]).astype(np.int64)),
        "flops": pa.array(checked.flops[rows]),
        "final_val_loss": loss,
        "best_val_loss": loss,
        "seed": pa.array(checked.seed[rows]),
        "budget_flops": floats(nums["budget"].values[rows]),
        "curves_source": pa.array(np.full(len(rows), IMPORTED, object), pa.string()),
        **{s: floats(nums[s].values[rows]) for s in scores},
    }
    table = pa.table(columns)
    return table.append_column("trial_id", _trial_ids(table))


def size_labels(ns: list[int]) -> dict[int, str]:
    """N -> its size label (`labelled`)."""
    import numpy as np

    distinct = np.unique(np.asarray(ns, np.int64))
    return dict(zip(distinct.tolist(), labelled(distinct).tolist(), strict=True))


def labelled(distinct: np.ndarray) -> np.ndarray:
    """The size label of each N of `distinct` (increasing, each once): N in increasing order
    form groups, each N joining the group of the N before it when the two round to the
    same 3 significant figures or are within CLOSE of each other (73.849999M and 73.850001M:
    one size); a group is labelled by its middle N (73.8M). Two groups never share a label:
    N that round alike are one group."""
    import numpy as np

    if not len(distinct):
        return np.zeros(0, object)
    n = distinct.astype(np.float64)
    figures = np.floor(np.log10(n)).astype(np.int64)
    figures += (n >= 10.0 ** (figures + 1)).astype(np.int64) - (n < 10.0**figures)
    unit = 10.0 ** (figures - (SIGNIFICANT - 1))
    rounded = np.rint(n / unit) * unit  # half to even, as f"{n:.3g}"
    joins = (np.diff(n) <= CLOSE * n[:-1]) | (rounded[1:] == rounded[:-1])
    starts = np.flatnonzero(np.r_[True, ~joins])
    middles = starts + np.diff(np.r_[starts, len(n)]) // 2
    names = np.array([_short(int(distinct[m]), SIGNIFICANT) for m in middles], object)
    return names[np.cumsum(np.r_[True, ~joins]) - 1]


def _short(n: float, digits: int) -> str:
    """n in `digits` significant figures with a unit: 124M, 1.3B (rounded first, so that
    999.95M is 1B, never 1e+03M)."""
    rounded = float(f"{n:.{digits}g}")
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if rounded >= scale:
            return f"{rounded / scale:.{digits}g}{unit}"
    return f"{rounded:.{digits}g}"


ID_FIELDS = ("variant", "size", "n_params", "tokens", "flops", "final_val_loss", "seed",
             "budget_flops")  # fmt: skip


def _trial_ids(table: pa.Table) -> pa.Array:
    """trial_id: 16 hex digits of a 64-bit hash of the row's values (ID_FIELDS) and of its
    rank among equal rows: numbers by their bits, text by its SHA-256 (each distinct value
    once), mixed by SplitMix64."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    n = table.num_rows
    parts = []
    for c in ID_FIELDS:
        col = table[c].combine_chunks()
        if pa.types.is_string(col.type):
            encoded = pc.dictionary_encode(col)
            digests = [_digest(v) for v in encoded.dictionary.to_pylist()] + [_digest(None)]
            at = pc.fill_null(encoded.indices, len(digests) - 1).to_numpy(zero_copy_only=False)
            parts.append(np.array(digests, np.uint64)[at])
        elif pa.types.is_integer(col.type):  # counts and seeds: never null
            parts.append(col.to_numpy().astype(np.int64).view(np.uint64))
        else:
            values = col.to_numpy(zero_copy_only=False)
            parts.append(np.where(np.isnan(values), np.uint64(_digest(None)),
                                  (values + 0.0).view(np.uint64)))  # fmt: skip
    h = np.zeros(n, np.uint64)
    for part in parts:
        h = _mix(h ^ part)
    from .import_checks import groups

    order, starts = groups(h.view(np.int64)[:, None])
    rank = np.empty(n, np.uint64)
    rank[order] = (np.arange(n) - np.repeat(starts, np.diff(np.r_[starts, n]))).astype(np.uint64)
    h = _mix(h ^ _mix(rank + np.uint64(1)))
    return pa.array([f"{x:016x}" for x in h.tolist()], pa.string())


def _digest(value: str | None) -> int:
    return int.from_bytes(hashlib.sha256(repr(value).encode()).digest()[:8], "little")


def _mix(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser, element-wise (uint64 arithmetic wraps)."""
    import numpy as np

    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _write(
    sweep: str, path: Path, rows: pa.Table, ignored: tuple[str, ...], root: Path | None,
    notes: tuple[str, ...], join_trained: bool,
) -> ImportResult:  # fmt: skip
    """The sweep's trials: its trained rows as they were, then `rows` in place of the rows
    imported before (under the sweep's lock: read, then rewritten)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from .columns import trials_schema

    old = tables.read_table(tables.TRIALS, sweep, root)
    schema = old.schema if old is not None else trials_schema([])
    extra = sorted({c for c in rows.column_names if c.startswith("eval_")} - set(schema.names))
    for name in extra:  # the file's downstream scores (import_scores.py): float columns
        schema = schema.insert(schema.get_field_index("config"), pa.field(name, pa.float64()))
    kept, replaced = schema.empty_table(), 0
    if old is not None:
        was_imported = pc.fill_null(pc.equal(old["curves_source"], IMPORTED), False)
        kept = old.filter(pc.invert(was_imported))
        replaced = old.num_rows - kept.num_rows
    if kept.num_rows and not join_trained:
        raise ResultsError(
            f"sweep {sweep!r} has {kept.num_rows} trained trial(s): imported rows would join "
            "their fits, plots and comparisons; import into a sweep of its own (another "
            "--sweep name), or pass --join-trained to mix them; nothing imported"
        )
    rows = rows.sort_by([("variant", "ascending"), ("n_params", "ascending"),
                         ("trial_id", "ascending")])  # fmt: skip
    table = pa.concat_tables([_as(kept, schema), _as(rows, schema)])
    trials_path = tables.write_table(tables.TRIALS, sweep, table, root)
    if tables.read_table(tables.CURVES, sweep, root) is None:  # plots read it: no curves
        empty = pa.Table.from_pylist([], tables.curves_schema())
        tables.write_table(tables.CURVES, sweep, empty, root)
    return ImportResult(sweep, path, rows.num_rows, replaced, kept.num_rows, ignored,
                        trials_path, notes)  # fmt: skip


def _as(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """`table`'s columns in `schema`'s order and types, null where it has none."""
    import pyarrow as pa

    return pa.table(
        [table[f.name].cast(f.type) if f.name in table.column_names
         else pa.nulls(table.num_rows, f.type) for f in schema],
        schema=schema,
    )  # fmt: skip


def imported_only(sweep: str, root: Path | None = None) -> bool:
    """True when the sweep's trials were all imported: no MLflow run stands behind it."""
    table = tables.read_table(tables.TRIALS, sweep, root)
    if table is None or table.num_rows == 0 or "curves_source" not in table.column_names:
        return False  # never synced, or rows from before the column: MLflow's
    return all(s == IMPORTED for s in table["curves_source"].to_pylist())


def parent_run(sweep: str, tracking_uri: str, root: Path | None = None) -> str | None:
    """The sweep's parent run in MLflow, or None for an imported sweep (none to look for)."""
    if imported_only(sweep, root):
        return None
    from .sources import find_sweep_runs

    return find_sweep_runs(sweep, tracking_uri).parent_run_id


def curves_of(sweep: str, root: Path | None = None) -> pa.Table:
    """The sweep's curves; an empty table when it has none (trials written without them,
    as a table written by hand or an older import: the plots draw what there is)."""
    curves = tables.read_table(tables.CURVES, sweep, root)
    if curves is not None:
        return curves
    import pyarrow as pa

    return pa.Table.from_pylist([], tables.curves_schema())
