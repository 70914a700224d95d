"""Where text comes from, read as a stream of document batches (never a whole corpus).

A source is `builtin:pydoc` (Python's own help topics), local files (a file, a folder, or a
glob; .parquet / .jsonl / .json / .csv read in Arrow batches, .txt one document per file),
or `hf:<name>[/<config>]`, a datasets hub dataset in streaming mode. Documents are numbered
from 0 in source order (files sorted by path), so `batches(start)` can resume anywhere:
whole Parquet files and row groups are skipped from their metadata, other files are read
through without being tokenised.
"""

from __future__ import annotations

import glob
import json
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from scalelab.jobs.config import MissingData

READ_BATCH = 512  # documents per batch handed to a tokeniser worker
GROUP_ITEMS = 16  # a larger Parquet row group is cut into this many items (see ParquetRows)
TEXT_SUFFIXES = {".parquet", ".jsonl", ".json", ".csv", ".txt"}
BUILTINS = ("builtin:pydoc", "builtin:copy", "builtin:sort", "builtin:classification",
            "builtin:topics")  # fmt: skip
Kind = Literal["pydoc", "synthetic", "classification", "topics", "local", "hub"]


def resolve_source(source: str) -> tuple[Kind, list[Path]]:
    """(kind, files) for a data.source, or a clear error before anything runs."""
    if source in BUILTINS:
        name = source.removeprefix("builtin:")
        kind = "synthetic" if name in ("copy", "sort") else name
        return kind, []  # type: ignore[return-value]
    if source.startswith("hf:"):
        return "hub", []
    if source.startswith("builtin:"):
        raise ValueError(f"unknown builtin data source {source!r}; allowed: {', '.join(BUILTINS)}")
    pattern = str(Path(source).expanduser())
    if glob.has_magic(pattern):
        matches = sorted(Path(p) for p in glob.glob(pattern, recursive=True))
        files = [p for p in matches if p.is_file()]
        if not files:
            raise MissingData("data.source", f"data.source {source!r}: no files match this pattern")
    else:
        path = Path(pattern)
        try:
            path.stat()
        except FileNotFoundError:
            pass  # said below, with what a source can be
        except OSError as e:  # a name too long, a loop of links, a folder it cannot enter
            raise ValueError(f"data.source {source!r}: {e.strerror}") from None
        if not path.exists():
            raise MissingData(
                "data.source",
                f"data.source {source!r}: no such file or folder (give a local "
                ".parquet/.jsonl/.json/.csv/.txt file, folder or glob, builtin:pydoc, "
                "builtin:copy, builtin:sort, or hf:<dataset>)",
            )
        if path.is_dir():  # a dataset folder: its text files, not README.md or .git/
            files = sorted(
                p
                for p in path.rglob("*")
                if p.is_file() and not any(s.startswith(".") for s in p.relative_to(path).parts)
            )
        else:
            files = [path]  # fmt: skip
    text = [p for p in files if p.suffix in TEXT_SUFFIXES]
    if not text:
        raise ValueError(
            f"data.source {source!r}: need files ending in {', '.join(sorted(TEXT_SUFFIXES))}, "
            f"found {[p.name for p in files][:5] or 'none'}"
        )
    return "local", text


@dataclass(frozen=True)
class TextSource:
    """A source of language-model text and the column that holds it."""

    spec: str
    kind: Kind
    text_field: str
    files: tuple[Path, ...] = ()

    @classmethod
    def open(cls, source: str, text_field: str) -> TextSource:
        kind, files = resolve_source(source)
        if kind not in ("pydoc", "local", "hub"):
            raise ValueError(f"data.source {source!r} is generated, not text to tokenise")
        return cls(source, kind, text_field, tuple(files))

    def fingerprint(self) -> Any:
        """What identifies the text: the files' paths, sizes and modification times; for
        pydoc the Python version (its topics change with it); for the hub the name."""
        if self.kind == "local":
            return [(str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns) for p in self.files]
        if self.kind == "pydoc":
            return f"pydoc-topics-{sys.version_info.major}.{sys.version_info.minor}"
        return self.spec

    def size_bytes(self) -> int | None:
        if self.kind == "local":
            return sum(p.stat().st_size for p in self.files)
        if self.kind == "pydoc":
            return sum(len(t.encode()) for t in _pydoc_topics())
        return None

    def documents(self) -> int | None:
        """How many documents there are, when it is cheap to know (for progress)."""
        if self.kind == "pydoc":
            return len(_pydoc_topics())
        if self.kind == "local" and all(p.suffix == ".parquet" for p in self.files):
            import pyarrow.parquet as pq

            return sum(pq.ParquetFile(p).metadata.num_rows for p in self.files)
        return None

    def batches(self, start: int = 0) -> Iterator[Sequence[str | None]]:
        """Batches of documents (None where a record has no text) from document `start` on:
        lists, or pyarrow string arrays for Arrow-read files (`.to_pylist()` gives a list)."""
        for docs in self.work(start):
            yield docs.read() if isinstance(docs, ParquetRows) else docs

    def work(self, start: int = 0) -> Iterator[Docs]:
        """Like `batches`, but Parquet documents come as `ParquetRows` (where they are in the
        file), read by whoever tokenises them."""
        if self.kind == "pydoc":
            topics = _pydoc_topics()
            for i in range(start, len(topics), READ_BATCH):
                yield topics[i : i + READ_BATCH]
        elif self.kind == "hub":
            yield from _hub_batches(self.spec, self.text_field, start)
        else:
            for path in self.files:
                start = yield from _file_batches(path, self.text_field, start)


@dataclass(frozen=True)
class ParquetRows:
    """Rows [start, stop) of one row group of a Parquet file: a work item that costs the
    process handing it out nothing to make (the file's metadata says where rows are) and
    little to send, so with many tokeniser workers that process does not become the limit.

    The reader decodes the row group in batches of `step` rows from its first row (Parquet
    cannot seek to a row), so items are `step`-aligned and `step` is at least a row group's
    1/GROUP_ITEMS: decoding a group costs at most ~GROUP_ITEMS/2 reads of it in all, little
    next to tokenising it, and an item holds at most `step` documents."""

    path: str
    field: str
    row_group: int
    start: int
    stop: int
    step: int

    def __len__(self) -> int:
        return self.stop - self.start

    def read(self) -> list[str | None]:
        import pyarrow as pa
        import pyarrow.parquet as pq

        parts, at = [], 0
        with pq.ParquetFile(self.path) as f:
            batches = f.iter_batches(batch_size=self.step, row_groups=[self.row_group],
                                     columns=[self.field], use_threads=False)  # fmt: skip
            for batch in batches:
                lo, hi = max(self.start - at, 0), min(self.stop - at, len(batch))
                if lo < hi:
                    parts.append(batch.column(0).slice(lo, hi - lo))
                at += len(batch)
                if at >= self.stop:
                    break
        return pa.concat_arrays(parts).to_pylist() if parts else []


Docs = Sequence[str | None] | ParquetRows  # a batch of documents, or where to read them


def _pydoc_topics() -> list[str]:
    from pydoc_data.topics import topics

    return [topics[k] for k in sorted(topics)]


# ----------------------------------------------------------------------------- local files


def _file_batches(path: Path, field: str, skip: int) -> Iterator[Docs]:
    """One file's documents after skipping `skip` of them; returns the skips left over."""
    if path.suffix == ".txt":
        if skip:
            return skip - 1
        yield [path.read_text(encoding="utf-8", errors="replace")]
        return 0
    if path.suffix == ".parquet":
        return (yield from _parquet_rows(path, field, skip))
    reader = _json_reader(path, field) if path.suffix in (".jsonl", ".json") else None
    reader = reader or _csv_reader(path, field)
    import pyarrow as pa

    for batch in reader:
        column = batch.column(batch.schema.get_field_index(field))
        _check_text_type(path, field, column.type)
        if skip >= len(column):
            skip -= len(column)
            continue
        for i in range(skip, len(column), READ_BATCH):
            # an Arrow array, compacted: a slice would pickle its whole parent batch
            yield pa.concat_arrays([column.slice(i, READ_BATCH)])
        skip = 0
    return skip


def _parquet_rows(path: Path, field: str, skip: int) -> Iterator[ParquetRows]:
    """The file's rows after the first `skip` as work items, from its metadata only;
    returns the skips left over."""
    import pyarrow.parquet as pq

    with pq.ParquetFile(path) as f:
        schema, meta = f.schema_arrow, f.metadata
    if field not in schema.names:
        raise _no_field(path, field, schema.names)
    _check_text_type(path, field, schema.field(field).type)
    for g in range(meta.num_row_groups):
        rows = meta.row_group(g).num_rows
        if skip >= rows:
            skip -= rows  # the whole row group is before `start`: never read
            continue
        step = max(READ_BATCH, -(-rows // GROUP_ITEMS))
        start, skip = skip, 0
        while start < rows:
            stop = min((start // step + 1) * step, rows)
            yield ParquetRows(str(path), field, g, start, stop, step)
            start = stop
    return skip


def _json_reader(path: Path, field: str) -> Iterator:
    import pyarrow as pa
    import pyarrow.json as pj

    with path.open("rb") as fh:
        first = next((line for line in fh if line.strip()), None)
    if first is None:
        return iter(())
    try:
        keys = list(json.loads(first))
    except (ValueError, TypeError):
        raise ValueError(f"{path}: not JSON lines (one JSON object per line)") from None
    if field not in keys:
        raise _no_field(path, field, keys)
    options = pj.ParseOptions(
        explicit_schema=pa.schema([(field, pa.large_string())]),
        unexpected_field_behavior="ignore",
    )
    try:
        return iter(pj.open_json(path, parse_options=options,
                                 read_options=pj.ReadOptions(block_size=1 << 22)))  # fmt: skip
    except pa.ArrowInvalid as e:
        raise ValueError(f"{path}: cannot be read as JSON lines: {e}") from None


def _csv_reader(path: Path, field: str) -> Iterator:
    import csv

    import pyarrow as pa
    import pyarrow.csv as pc

    with path.open(newline="", encoding="utf-8", errors="replace") as fh:
        header = next(csv.reader(fh), [])
    if field not in header:
        raise _no_field(path, field, header)
    convert = pc.ConvertOptions(include_columns=[field], column_types={field: pa.large_string()})
    return iter(pc.open_csv(path, convert_options=convert))


def _check_text_type(path: Path, field: str, arrow_type: Any) -> None:
    import pyarrow as pa

    if not (pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type)
            or pa.types.is_string_view(arrow_type) or pa.types.is_null(arrow_type)):  # fmt: skip
        raise ValueError(f"{path}: column {field!r} holds {arrow_type}, not text")


def _no_field(where: object, field: str, columns: list[str]) -> ValueError:
    return ValueError(
        f"data.text_field {field!r} is not a column of {where} (columns: {columns}); "
        "set data.text_field (--text-field) to the column that holds the text"
    )


# ----------------------------------------------------------------------------- the hub


def _hub_batches(source: str, field: str, start: int) -> Iterator[list[str | None]]:
    import datasets

    from scalelab.jobs.config import DataConfig
    from scalelab.jobs.data.classification import _HonourOfflineEnv, hub_error, hub_id

    path, config = hub_id(source)
    with _HonourOfflineEnv():
        try:
            ds = datasets.load_dataset(path, config, split="train", streaming=True)
        except Exception as e:
            raise hub_error(DataConfig(source=source), e) from None
        yield from stream_dataset(ds, field, start, where=source)


def stream_dataset(ds: Any, field: str, start: int, where: str) -> Iterator[list[str | None]]:
    """Batches of `field` from a datasets IterableDataset, from example `start` on."""
    columns = ds.column_names
    if columns is not None and field not in columns:
        raise _no_field(where, field, list(columns))
    ds = ds.skip(start) if start else ds
    for batch in ds.select_columns([field]).iter(batch_size=READ_BATCH):
        yield batch[field]
