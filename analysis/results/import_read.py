"""How `results import` reads a file (imports.py; docs/results.md, "Importing results"),
within limits a small hostile file cannot get past: at most `max_rows` rows (counted
before parsing: the lines of a text file, a Parquet file's metadata), at most `max_bytes`
of text, at most `max_columns` columns or JSON keys, JSON nested at most `max_depth`
deep (measured before any JSON parser sees the line), at most `max_cells` values read
(rows times the columns that fields read: a key that JSON Lines gives on one line is a
column of every row). Only the columns a field reads are parsed into memory; the others
are named.
"""

from __future__ import annotations

import codecs
import io
import json
import re
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .import_checks import check_path, check_utf8_bytes, visible
from .tables import ResultsError

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

SUFFIXES = {".csv": "csv", ".parquet": "parquet", ".pq": "parquet", ".jsonl": "json",
            ".ndjson": "json", ".json": "json"}  # fmt: skip
MAX_LISTED = 20  # problems listed in one error
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')  # a JSON string, to measure depth without them


@dataclass(frozen=True)
class ImportLimits:
    max_rows: int = 2_000_000  # `--max-rows`
    max_bytes: int = 512 << 20  # a CSV or JSON Lines file's size
    max_columns: int = 1_000  # a CSV header's columns, a JSON Lines file's distinct keys
    max_depth: int = 64  # a JSON line's nesting of arrays and objects
    max_cells: int = 64_000_000  # rows x the columns that fields read (a sparse JSON key too)


@dataclass(frozen=True)
class Points:
    """A file's columns that fields read (`table`), every column's name in the file's
    order, and where each row is: its line (CSV, JSON Lines) or None (Parquet: row i+1)."""

    table: pa.Table
    names: tuple[str, ...]
    lines: np.ndarray | None

    def where(self, i: int) -> str:
        """'12' for a line, 'row 12' for Parquet."""
        return f"row {i + 1}" if self.lines is None else str(int(self.lines[i]))

    def places(self, rows: np.ndarray, prefix: str) -> pa.Array:
        """`prefix` + where(i) for each row i of `rows`, as text."""
        import pyarrow as pa
        import pyarrow.compute as pc

        at = rows + 1 if self.lines is None else self.lines[rows]
        head = prefix + ("row " if self.lines is None else "")
        return pc.binary_join_element_wise(head, pa.array(at).cast(pa.string()), "")


def read_points(path: Path, wanted: Callable[[str], bool], limits: ImportLimits) -> Points:
    """The file's rows, with only the columns `wanted` reads parsed (module doc)."""
    import pyarrow as pa

    check_path(path)
    kind = SUFFIXES.get(path.suffix.lower())
    if kind is None:
        raise ResultsError(
            f"{path}: unknown format {visible(path.suffix)!r} (expected .csv, .parquet or .jsonl)"
        )
    try:
        if kind == "parquet":
            return _read_parquet(path, wanted, limits)
        size = path.stat().st_size
        if size > limits.max_bytes:
            raise ResultsError(
                f"{path}: {size / 2**20:,.0f} MiB, larger than the {limits.max_bytes >> 20} MiB "
                "a CSV or JSON Lines file may be: save it as Parquet"
            )
        data = path.read_bytes()
        check_utf8_bytes(path, data)
        data = data.removeprefix(codecs.BOM_UTF8)
        lines = _content_lines(path, data, limits)
        if kind == "csv":
            return _read_csv(path, data, lines, wanted, limits)
        return _read_jsonl(path, data, lines, wanted, limits)
    except (pa.ArrowException, OSError) as e:  # pyarrow's own words, in one line
        raise ResultsError(f"{path}: cannot read it ({_first_line(e)})") from None
    except UnicodeDecodeError:  # a Parquet file's column name (its text is checked above)
        raise ResultsError(f"{path}: cannot read it (a column name is not UTF-8)") from None


def _first_line(e: BaseException) -> str:
    return next((s.strip() for s in str(e).splitlines() if s.strip()), type(e).__name__)


def _check_cells(path: Path, rows: int, columns: int, limits: ImportLimits) -> None:
    if rows * columns > limits.max_cells:
        raise ResultsError(
            f"{path}: {rows:,} rows of {columns:,} columns read, more than "
            f"{limits.max_cells:,} values: keep the columns of one ladder"
        )


def _too_many(path: Path, n: int, limits: ImportLimits) -> ResultsError:
    return ResultsError(
        f"{path}: {n:,} rows, more than {limits.max_rows:,}: split the file, or raise the "
        "limit with --max-rows"
    )


def _content_lines(path: Path, data: bytes, limits: ImportLimits) -> np.ndarray:
    """The numbers (from 1) of the lines that hold something; pyarrow skips empty ones."""
    import numpy as np

    if data.count(b"\n") > 2 * limits.max_rows + 1:  # before an array of every line
        raise _too_many(path, data.count(b"\n"), limits)
    raw = np.frombuffer(data, np.uint8)
    ends = np.flatnonzero(raw == 10)
    if not data.endswith(b"\n"):
        ends = np.append(ends, len(data))
    starts = np.concatenate(([0], ends[:-1] + 1)) if len(ends) else np.zeros(0, np.int64)
    lengths = ends - starts
    cr = np.zeros(len(ends), bool)
    cr[lengths > 0] = raw[ends[lengths > 0] - 1] == 13
    return np.flatnonzero(lengths - cr > 0) + 1


def _read_parquet(path: Path, wanted: Callable[[str], bool], limits: ImportLimits) -> Points:
    import pyarrow as pa
    import pyarrow.parquet as pq

    meta = pq.ParquetFile(path)
    if meta.metadata.num_rows > limits.max_rows:
        raise _too_many(path, meta.metadata.num_rows, limits)
    names = tuple(meta.schema_arrow.names)
    columns = [c for c in dict.fromkeys(names) if wanted(c)]
    _check_cells(path, meta.metadata.num_rows, len(columns), limits)
    text = [c for c in columns if _is_text(meta.schema_arrow.field(c).type)]
    # text kept as a dictionary: a repeated long value is not copied into every row
    table = pq.ParquetFile(path, read_dictionary=text).read(columns=columns, use_threads=False)
    for i, name in enumerate(table.column_names):  # text that is not UTF-8: its bytes
        try:
            table[name].validate(full=True)
        except pa.ArrowInvalid:
            table = table.set_column(i, name, _as_bytes(table[name]))
    return Points(table if columns else pa.table({}), names, None)


def _as_bytes(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """A text column whose bytes are not all UTF-8, as bytes: each row is then checked on
    its own (and refused where it is not UTF-8)."""
    import pyarrow as pa

    t = column.type
    if pa.types.is_dictionary(t):
        chunks = [c.dictionary.cast(pa.binary()).take(c.indices) for c in column.chunks]
        return pa.chunked_array(chunks, pa.binary())
    return column.cast(pa.large_binary() if pa.types.is_large_string(t) else pa.binary())


def _is_text(t: pa.DataType) -> bool:
    import pyarrow as pa

    kinds = (pa.types.is_string, pa.types.is_large_string, pa.types.is_binary,
             pa.types.is_large_binary)  # fmt: skip
    return any(kind(t) for kind in kinds)


def _read_csv(
    path: Path, data: bytes, lines: np.ndarray, wanted: Callable[[str], bool],
    limits: ImportLimits,
) -> Points:  # fmt: skip
    import pyarrow as pa
    import pyarrow.csv as pcsv

    if len(lines) - 1 > limits.max_rows:
        raise _too_many(path, len(lines) - 1, limits)
    first = data.lstrip(b"\r\n").split(b"\n", 1)[0]  # the header: the first line with text
    if first.count(b",") + 1 > limits.max_columns:
        raise ResultsError(f"{path}: more than {limits.max_columns:,} columns")
    names = tuple(pcsv.read_csv(pa.py_buffer(first + b"\n")).column_names) if first.strip() else ()
    _check_cells(path, len(lines) - 1, sum(map(wanted, dict.fromkeys(names))), limits)
    bad: list[str] = []
    texts: list[str] = []
    searched = [0]  # rows come in order: look for the next one after the last found

    def invalid(row: Any) -> str:  # pyarrow's InvalidRow: its text (its number is unknown)
        if not texts:
            texts.extend(s.rstrip(b"\r").decode("utf-8", "replace") for s in data.split(b"\n"))
        line: int | str = row.number if row.number is not None else "?"
        for k, n in enumerate(lines[searched[0] :].tolist(), searched[0]):
            if texts[n - 1] == row.text:
                line, searched[0] = n, k + 1
                break
        if len(bad) < MAX_LISTED:
            bad.append(
                f"{path}:{line}: {row.actual_columns} fields where the header has "
                f"{row.expected_columns} ({row.text[:200]!r})"
            )
        return "skip"

    table = pcsv.read_csv(
        pa.py_buffer(data),
        parse_options=pcsv.ParseOptions(invalid_row_handler=invalid),
        convert_options=pcsv.ConvertOptions(
            strings_can_be_null=True, include_columns=[c for c in dict.fromkeys(names) if wanted(c)]
        ),
    )
    if bad:
        raise ResultsError("\n".join(bad))
    return Points(table, names, lines[1:])


def _read_jsonl(
    path: Path, data: bytes, lines: np.ndarray, wanted: Callable[[str], bool],
    limits: ImportLimits,
) -> Points:  # fmt: skip
    """Each line a JSON object, its depth measured before it is parsed; the values of each
    key a field reads, as a column of their own type (every value as text where the types
    differ from line to line, so that the row checks name the line of the odd one)."""
    import numpy as np

    if len(lines) > limits.max_rows:
        raise _too_many(path, len(lines), limits)
    keys: dict[str, tuple[array[int], list[Any]]] = {}  # key -> (rows, values): sparse
    row = 0
    for n, line in enumerate(io.BytesIO(data), 1):
        line = line.strip()
        if not line:
            continue
        if line.count(b"[") + line.count(b"{") > limits.max_depth:
            depth = _depth(line)
            if depth > limits.max_depth:
                raise ResultsError(
                    f"{path}:{n}: nested {depth} deep, deeper than {limits.max_depth}"
                )
        try:
            value = json.loads(line)
        except json.JSONDecodeError as bad:
            raise ResultsError(f"{path}:{n}: not JSON ({bad.msg} at column {bad.colno})") from None
        except (ValueError, RecursionError) as bad:
            raise ResultsError(f"{path}:{n}: not JSON ({_first_line(bad)})") from None
        if not isinstance(value, dict):
            raise ResultsError(f"{path}:{n}: not a JSON object")
        for k, v in value.items():
            if k not in keys:
                if len(keys) >= limits.max_columns:
                    raise ResultsError(
                        f"{path}:{n}: more than {limits.max_columns:,} different keys"
                    )
                keys[k] = (array("q"), [])
            if v is not None and wanted(k):
                keys[k][0].append(row)
                keys[k][1].append(v)
        row += 1
    _check_cells(path, row, sum(map(wanted, keys)), limits)
    columns = {k: _column(rows, values, row) for k, (rows, values) in keys.items() if wanted(k)}
    import pyarrow as pa

    table = pa.table(columns) if columns else pa.table({"": np.zeros(row)}).drop_columns([""])
    return Points(table, tuple(keys), lines)


def _depth(line: bytes) -> int:
    """How deep a JSON line nests arrays and objects (brackets in its strings not counted)."""
    import numpy as np

    bare = np.frombuffer(_STRING.sub(b'""', line), np.uint8)
    step = np.isin(bare, (91, 123)).astype(np.int64) - np.isin(bare, (93, 125))
    return int(np.cumsum(step).max(initial=0))


def _column(rows: array[int], values: list[Any], n: int) -> pa.Array:
    """n values, `values` at `rows` and null elsewhere: of their own type when pyarrow can
    hold them all as one (numbers, text), else every value as its text."""
    import numpy as np
    import pyarrow as pa

    if len(rows) == n:
        take = None
    else:
        take = np.full(n, -1, np.int64)
        take[np.frombuffer(rows, np.int64)] = np.arange(len(rows))
    try:
        array = pa.array(values)
        if pa.types.is_null(array.type) or pa.types.is_struct(array.type):
            raise TypeError  # an object: its text, as any other value that is not a number
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError, ValueError):
        array = pa.array([v if isinstance(v, str) else json.dumps(v) for v in values], pa.string())
    if take is None:
        return array
    indices = pa.array(take, mask=take < 0)
    return array.take(indices)
