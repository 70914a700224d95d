"""Tokenising batches of documents in a pool of worker processes, results in source order.

The main process hands out work and takes back numpy arrays: for Parquet (the format of
hub-scale corpora) only where the rows are (jobs/data/sources.py, ParquetRows), which the worker
reads itself, so the main process stays far from being the limit however many workers
there are; for JSONL / CSV Arrow arrays it read (no Python strings are made in the main
process), for the rest lists of texts. Each worker cuts its documents into pieces,
tokenises them, appends the separator after each document's last piece and returns the
tokens in the shard dtype, with every piece's length and place. Workers are spawned (not forked: a trial's process has
threads) and exit when the main process dies.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from scalelab.jobs.data.sources import Docs, ParquetRows
from scalelab.jobs.data.tokenizers import Tokenizer

# documents are cut into pieces of at most this many characters (part of the data's format,
# jobs/data/shards.py FORMAT; defined here so the workers need not import the manifest's models)
PIECE_CHARS = 1 << 16


@dataclass(frozen=True)
class DocBatch:
    texts: Docs | Any  # a list, a pyarrow string array, or Parquet rows to read
    first_doc: int  # the source index of texts[0]
    first_piece: int  # pieces of texts[0] already consumed (a resumed run)


@dataclass(frozen=True)
class Encoded:
    """One batch's pieces: tokens (+ separators), and per piece its length, document, piece
    number within the document and whether it is the document's last."""

    tokens: np.ndarray
    lengths: np.ndarray
    docs: np.ndarray
    pieces: np.ndarray
    last: np.ndarray


def split_pieces(text: str) -> list[str]:
    """Pieces of at most PIECE_CHARS characters, cut after a line break where one is in the
    second half of the piece (so a source of one huge text still gets a validation part)."""
    pieces, i = [], 0
    while len(text) - i > PIECE_CHARS:
        cut = text.rfind("\n", i + PIECE_CHARS // 2, i + PIECE_CHARS)
        cut = cut + 1 if cut >= 0 else i + PIECE_CHARS
        pieces.append(text[i:cut])
        i = cut
    pieces.append(text[i:])
    return pieces


_tokenizer: Tokenizer | None = None
_dtype = np.dtype("uint32")
_separator = np.zeros(0, np.uint32)


def init_worker(tokenizer: Tokenizer, dtype: str, parent: int = 0) -> None:
    global _tokenizer, _dtype, _separator
    if parent:  # a pool worker: the main process handles Ctrl-C; exit if it is killed
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
        threading.Thread(target=_exit_with_parent, args=(parent,), daemon=True).start()
    _tokenizer, _dtype = tokenizer, np.dtype(dtype)
    _separator = np.asarray(_tokenizer.separator, dtype=np.uint32)


def _exit_with_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(1)


def encode(batch: DocBatch) -> Encoded:
    tok, sep = _tokenizer, _separator
    assert tok is not None, "init_worker first"
    texts = _read(batch.texts)
    chunks, docs, pieces, last = [], [], [], []
    for i, text in enumerate(texts):
        parts = split_pieces(text or "")
        for k in range(batch.first_piece if i == 0 else 0, len(parts)):
            chunks.append(parts[k])
            docs.append(batch.first_doc + i)
            pieces.append(k)
            last.append(k == len(parts) - 1)
    arrays, lengths = [], np.zeros(len(chunks), dtype=np.int64)
    for j, ids in enumerate(tok.encode_arrays(chunks)):
        if len(ids):
            arrays += [ids, sep] if last[j] else [ids]
            lengths[j] = len(ids) + (len(sep) if last[j] else 0)
    flat = np.concatenate(arrays, dtype=np.uint32) if arrays else np.zeros(0, np.uint32)
    limit = np.iinfo(_dtype).max
    if flat.size and int(flat.max()) > limit:
        raise ValueError(
            f"tokenizer {tok.name!r} produced token id {int(flat.max())}, which does not fit "
            f"{_dtype.name} shards (max {limit}): its vocabulary is larger than the "
            f"{tok.vocab_size} tokens it reports"
        )
    return Encoded(flat.astype(_dtype), lengths, np.asarray(docs, dtype=np.int64),
                   np.asarray(pieces, dtype=np.int64), np.asarray(last, dtype=bool))  # fmt: skip


def _read(docs: Docs | Any) -> Sequence[str | None]:
    if isinstance(docs, ParquetRows):
        return docs.read()
    return docs.to_pylist() if hasattr(docs, "to_pylist") else docs


def encoded(
    batches: Iterator[DocBatch], workers: int, tokenizer: Tokenizer, dtype: str
) -> Iterator[Encoded]:
    """Encoded batches in source order: in this process (workers=0), or in a pool with a
    bounded number in flight, so memory stays flat whatever the source's size."""
    if workers == 0:
        init_worker(tokenizer, dtype)
        yield from map(encode, batches)
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    pool = ProcessPoolExecutor(
        workers, mp_context=multiprocessing.get_context("spawn"), initializer=init_worker,
        initargs=(tokenizer, dtype, os.getpid()),
    )  # fmt: skip
    pending: deque = deque()
    try:
        for batch in batches:
            pending.append(pool.submit(encode, batch))
            if len(pending) >= 3 * workers:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
