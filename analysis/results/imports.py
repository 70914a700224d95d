"""`scalelab results import FILE --sweep NAME`: points someone else measured (a published
ladder, another framework's runs) as rows of the sweep's `trials` table, so that every
`results` command answers on them without an MLflow run behind them (docs/results.md,
"Importing results").

A file is CSV, Parquet or JSON Lines (by its suffix) with one row per trial: the parameter
count (N), the training tokens (D) or compute (C), and the final loss or a downstream
score (import_scores.py: `eval_<task>_acc`, `acc_<task>`, a correct-answer loss); optionally the
variant, the seed, a size label and a nominal IsoFLOP budget. The file is questioned first
(import_checks.py: a file, UTF-8 text, no row repeated, C near 6ND), then every row is
checked before anything is written; the problems come back as `FILE:LINE: what is wrong`
(Parquet: `FILE:row R`). A row without a size label gets one from N to 3 significant
figures, nearly equal N sharing it. Imported rows are marked `curves_source = "imported"`:
importing again replaces the sweep's imported rows (never its synced ones), and `sync`
keeps them.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scalelab.contract.runs import Status

from . import store
from .import_checks import (
    FLOPS_PER_PARAM_TOKEN,
    Duplicates,
    check_path,
    check_utf8,
    flops_note,
    flops_ratio,
    repeats,
    rival_note,
    text,
)
from .import_scores import score_column, score_value
from .store import ResultsError

if TYPE_CHECKING:
    import pyarrow as pa

IMPORTED = "imported"  # the trials' curves_source: rows no MLflow run stands behind
MAX_LISTED = 20  # problems listed in one error
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
SUFFIXES = {".csv": "csv", ".parquet": "parquet", ".pq": "parquet", ".jsonl": "json",
            ".ndjson": "json", ".json": "json"}  # fmt: skip
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
            text += f"; ignored columns: {', '.join(self.ignored)}"
        for note in self.notes:
            text += f"; {note}"
        return f"{text} -> {self.trials_path}"


def import_file(
    path: Path | str, sweep: str, *, root: Path | None = None,
    duplicates: Duplicates | str = Duplicates.REFUSE, wait_s: float | None = None,
) -> ImportResult:  # fmt: skip
    """Check every row of `path` and write them as the sweep's imported trials (module doc);
    ResultsError listing each bad line, and nothing written, when any row is wrong.
    `duplicates`: what rows identical in every field read are (import_checks.Duplicates);
    `wait_s`: how long to wait for another writer of the sweep's tables (store.tables_lock)."""
    path, policy = Path(path), Duplicates(duplicates)
    store.sweep_dir(sweep, root)  # a name no sweep can have fails here, before reading
    table, where = read_points(path)
    fields, ignored = _fields(table.column_names, path)
    columns = {f: table[c].to_pylist() for f, c in fields.items()}
    raw = [{f: values[i] for f, values in columns.items()} for i in range(table.num_rows)]
    checked, copies = _check_rows(raw, path, where, policy)
    if policy is Duplicates.MERGE:
        checked = {i: t for i, t in checked.items() if i not in copies}
    ratios = [t["flops"] / (FLOPS_PER_PARAM_TOKEN * t["n_params"] * t["tokens"])
              for i, t in checked.items() if _given(raw[i], "D", "C")]  # fmt: skip
    rows = list(checked.values())
    notes = (
        _copies_note(len(copies), policy) if copies else None,
        flops_note(ratios),
        rival_note(rows),
    )
    _label_sizes(rows)
    _number_duplicates(rows)
    with store.tables_lock(sweep, root, wait_s):  # the sweep's tables: read, then rewritten
        return _write(sweep, path, rows, tuple(ignored), root, tuple(n for n in notes if n))


def _check_rows(
    raw: list[dict[str, Any]], path: Path, where: Any, policy: Duplicates
) -> tuple[dict[int, dict[str, Any]], dict[int, int]]:
    """Each row's trial by its index, and each row that repeats an earlier one in every
    field read -> that row; ResultsError listing every problem (a repeat is one unless
    `policy` says what repeats are)."""
    checked: dict[int, dict[str, Any]] = {}
    problems: list[tuple[int, str]] = []
    for i, row in enumerate(raw):
        try:
            checked[i] = _trial(row, path, where(i))
        except ValueError as e:
            problems.append((i, f"{path}:{where(i)}: {e}"))
    copies = {j: i for j, i in repeats(raw).items() if j in checked}
    if policy is Duplicates.REFUSE:
        problems += [(j, f"{path}:{where(j)}: the same as {_place(where(i))} in every field "
                         "read") for j, i in copies.items()]  # fmt: skip
    if not raw:
        problems.append((0, f"{path}: no rows"))
    if problems:
        raise ResultsError(
            _problems_text(path, problems, policy is Duplicates.REFUSE and bool(copies))
        )
    return checked, copies


def _place(where: str) -> str:
    """'line 12', or for Parquet 'row 12'."""
    return where if where.startswith("row") else f"line {where}"


def _problems_text(path: Path, problems: list[tuple[int, str]], copies: bool) -> str:
    """The error: each problem in the file's order (the first MAX_LISTED), and what to do
    about rows that repeat another."""
    listed = [p for _, p in sorted(problems, key=lambda p: p[0])]
    more = len(listed) - MAX_LISTED
    listed = listed[:MAX_LISTED] + ([f"... and {more} more"] if more > 0 else [])
    if copies:
        listed.append(
            "identical rows: --duplicates merge imports each once, --duplicates keep "
            "imports every copy as a trial of its own"
        )
    head = f"{path}: {len(problems)} bad row(s), nothing imported:\n" if len(problems) > 1 else ""
    return head + "\n".join(listed)


def _copies_note(n: int, policy: Duplicates) -> str:
    done = "merged (each imported once)" if policy is Duplicates.MERGE else "kept as trials"
    return f"{n} repeated row(s) {done}"


def _given(row: dict[str, Any], *fields: str) -> bool:
    return all(text(row.get(f), f) is not None for f in fields)


def read_points(path: Path) -> tuple[pa.Table, Any]:
    """The file as a table, and `where(i)`: where row i is in the file ("12" for a line,
    "row 12" for Parquet)."""
    import pyarrow as pa

    check_path(path)
    kind = SUFFIXES.get(path.suffix.lower())
    if kind is None:
        raise ResultsError(
            f"{path}: unknown format {path.suffix!r} (expected .csv, .parquet or .jsonl)"
        )
    try:
        if kind == "parquet":
            import pyarrow.parquet as pq

            return pq.read_table(path), lambda i: f"row {i + 1}"
        check_utf8(path)
        lines = _content_lines(path)
        if kind == "csv":
            return _read_csv(path, lines), lambda i: str(lines[i + 1])
        return _read_jsonl(path), lambda i: str(lines[i])
    except (pa.ArrowInvalid, OSError) as e:
        raise ResultsError(f"{path}: cannot read it ({e})") from None


def _content_lines(path: Path) -> list[int]:
    """The numbers of the lines that hold something (pyarrow skips empty ones)."""
    with open(path, "rb") as f:
        return [n for n, line in enumerate(f, 1) if line.strip(b"\r\n")]


def _read_csv(path: Path, lines: list[int]) -> pa.Table:
    import pyarrow.csv as pcsv

    bad: list[str] = []
    with open(path, "rb") as f:
        texts = [line.rstrip(b"\r\n").decode("utf-8", "replace") for line in f]
    searched = [0]  # rows come in order: look for the next one after the last found

    def invalid(row: Any) -> str:  # pyarrow's InvalidRow: its text (its number is unknown)
        line: int | str = row.number if row.number is not None else "?"
        for k, n in enumerate(lines[searched[0] :], searched[0]):
            if texts[n - 1] == row.text:
                line, searched[0] = n, k + 1
                break
        bad.append(
            f"{path}:{line}: {row.actual_columns} fields where the header has "
            f"{row.expected_columns} ({row.text!r})"
        )
        return "skip"

    table = pcsv.read_csv(
        path,
        parse_options=pcsv.ParseOptions(invalid_row_handler=invalid),
        convert_options=pcsv.ConvertOptions(strings_can_be_null=True),
    )
    if bad:
        raise ResultsError("\n".join(bad[:MAX_LISTED]))
    return table


def _read_jsonl(path: Path) -> pa.Table:
    """pyarrow's reader; when it refuses the file, the first line json cannot read or that
    is not an object says where."""
    import pyarrow as pa
    import pyarrow.json as pjson

    try:
        return pjson.read_json(path)
    except pa.ArrowInvalid:
        pass
    # pyarrow refuses a column whose type changes from line to line ("3.1", then "x"), and
    # says neither where nor why in words: read each line, every value as text, and let the
    # row checks name the line
    records = []
    with open(path, "rb") as f:
        for n, line in enumerate(f, 1):
            if not line.strip(b"\r\n"):
                continue
            try:
                value = json.loads(line.strip())
            except json.JSONDecodeError as bad:
                raise ResultsError(
                    f"{path}:{n}: not JSON ({bad.msg} at column {bad.colno})"
                ) from None
            except ValueError as bad:  # not UTF-8
                raise ResultsError(f"{path}:{n}: not JSON ({bad})") from None
            if not isinstance(value, dict):
                raise ResultsError(f"{path}:{n}: not a JSON object")
            records.append(value)
    names = list(dict.fromkeys(k for r in records for k in r))
    return pa.table(
        {k: pa.array([None if r.get(k) is None else str(r[k]) for r in records], pa.string())
         for k in names}
    )  # fmt: skip


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
        raise ResultsError(
            f"{path}: no column for {'; '.join(missing)} (columns: {', '.join(names) or 'none'})"
        )
    ignored = [c for c in names if c not in fields.values()]
    return fields, ignored


def _positive(row: dict[str, Any], field: str) -> float | None:
    """The field's value as a positive finite number; None when it is missing."""
    value = row.get(field)
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{field} {value!r} is not a number") from None
    if not math.isfinite(x) or x <= 0:
        raise ValueError(f"{field} {value!r}: expected a positive finite number")
    return x


def _trial(row: dict[str, Any], path: Path, where: str) -> dict[str, Any]:
    """One checked row of the trials table (ValueError saying what is wrong)."""
    n = _positive(row, "N")
    if n is None:
        raise ValueError("N is missing")
    d, c = _positive(row, "D"), _positive(row, "C")
    if d is None and c is None:
        raise ValueError("both D and C are missing")
    loss = _positive(row, "loss")
    scores = {f: score_value(f, v) for f, v in row.items() if f.startswith("eval_")}
    if loss is None and not any(v is not None for v in scores.values()):
        raise ValueError("loss is missing" + (" (and every score)" if scores else ""))
    if d is not None and c is not None:
        flops_ratio(n, d, c)  # ValueError when C contradicts 6ND
    d = d if d is not None else c / (FLOPS_PER_PARAM_TOKEN * n)  # type: ignore[operator]
    c = c if c is not None else FLOPS_PER_PARAM_TOKEN * n * d
    seed = row.get("seed")
    if seed is None or (isinstance(seed, str) and not seed.strip()):
        seed = 0
    else:
        try:
            f = float(seed)
        except (TypeError, ValueError):
            raise ValueError(f"seed {seed!r} is not an integer") from None
        if not f.is_integer():
            raise ValueError(f"seed {seed!r} is not an integer")
        seed = int(f)
    budget = _positive(row, "budget")
    name = text(row.get("name"), "name")
    return {
        "name": name or f"{path.name}:{where}",
        "variant": text(row.get("variant"), "variant") or DEFAULT_VARIANT,
        "size": text(row.get("size"), "size"),
        "status": Status.FINISHED,
        "n_params": round(n),
        "tokens": round(d),
        "flops": c,
        "final_val_loss": loss,
        "best_val_loss": loss,
        "seed": seed,
        "budget_flops": budget,
        "curves_source": IMPORTED,
        **scores,
    }


def _label_sizes(rows: list[dict[str, Any]]) -> None:
    """A row without a size label gets its group's (size_labels)."""
    labels = size_labels([r["n_params"] for r in rows if r["size"] is None])
    for r in rows:
        if r["size"] is None:
            r["size"] = labels[r["n_params"]]


def size_labels(ns: list[int]) -> dict[int, str]:
    """N -> its size label: N in increasing order form groups, each N joining the group of
    the N before it when the two round to the same 3 significant figures or are within
    CLOSE of each other (73.849999M and 73.850001M: one size); a group is labelled by its
    middle N (73.8M). Two groups never share a label: N that round alike are one group."""
    groups: list[list[int]] = []
    for n in sorted(set(ns)):
        if groups and _same_size(groups[-1][-1], n):
            groups[-1].append(n)
        else:
            groups.append([n])
    return {n: _short(g[len(g) // 2], SIGNIFICANT) for g in groups for n in g}


def _same_size(smaller: int, n: int) -> bool:
    close = n - smaller <= CLOSE * smaller
    return close or _short(smaller, SIGNIFICANT) == _short(n, SIGNIFICANT)


def _short(n: float, digits: int) -> str:
    """n in `digits` significant figures with a unit: 124M, 1.3B (rounded first, so that
    999.95M is 1B, never 1e+03M)."""
    rounded = float(f"{n:.{digits}g}")
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if rounded >= scale:
            return f"{rounded / scale:.{digits}g}{unit}"
    return f"{rounded:.{digits}g}"


def _number_duplicates(rows: list[dict[str, Any]]) -> None:
    """trial_id: a hash of the row's values, and of its rank among equal rows."""
    seen: dict[str, int] = {}
    for r in rows:
        key = json.dumps([r[k] for k in ("variant", "size", "n_params", "tokens", "flops",
                                          "final_val_loss", "seed", "budget_flops")])  # fmt: skip
        k = seen.get(key, 0)
        seen[key] = k + 1
        r["trial_id"] = hashlib.sha256(f"{key}#{k}".encode()).hexdigest()[:16]


def _write(
    sweep: str, path: Path, rows: list[dict[str, Any]], ignored: tuple[str, ...],
    root: Path | None, notes: tuple[str, ...],
) -> ImportResult:  # fmt: skip
    import pyarrow as pa

    from .columns import trials_schema

    old = store.read_table(store.TRIALS, sweep, root)
    schema = old.schema if old is not None else trials_schema([])
    extra = sorted({k for r in rows for k in r if k.startswith("eval_")} - set(schema.names))
    for name in extra:  # the file's downstream scores (import_scores.py): float columns
        schema = schema.insert(schema.get_field_index("config"), pa.field(name, pa.float64()))
    kept: list[dict[str, Any]] = []
    replaced = 0
    if old is not None:
        for r in old.to_pylist():
            if r.get("curves_source") == IMPORTED:
                replaced += 1
            else:
                kept.append(r)
    rows.sort(key=lambda r: (r["variant"], r["n_params"], r["trial_id"]))
    table = pa.Table.from_pylist([{k: r.get(k) for k in schema.names} for r in kept + rows],
                                 schema)  # fmt: skip
    trials_path = store.write_table(store.TRIALS, sweep, table, root)
    if store.read_table(store.CURVES, sweep, root) is None:  # plots read it: no curves
        empty = pa.Table.from_pylist([], store.curves_schema())
        store.write_table(store.CURVES, sweep, empty, root)
    return ImportResult(sweep, path, len(rows), replaced, len(kept), ignored, trials_path,
                        notes)  # fmt: skip


def imported_only(sweep: str, root: Path | None = None) -> bool:
    """True when the sweep's trials were all imported: no MLflow run stands behind it."""
    table = store.read_table(store.TRIALS, sweep, root, columns=["curves_source"])
    if table is None or table.num_rows == 0:
        return False
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
    curves = store.read_table(store.CURVES, sweep, root)
    if curves is not None:
        return curves
    import pyarrow as pa

    return pa.Table.from_pylist([], store.curves_schema())
