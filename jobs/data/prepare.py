"""Tokenise a text source into token shards once per (source, tokenizer).

`prepare_source` streams the source's documents in order, has them tokenised in a pool of
worker processes (jobs/data/tokenise.py: results in source order, a bounded number in flight,
so memory stays a few batches), and appends each piece's tokens (documents are cut into
pieces of at most PIECE_CHARS characters; the separator follows a document's last piece)
to the validation split or to the current train shard (jobs/data/shards.py). Pieces 0, 20,
40, ... are validation text until that split holds VAL_MAX_TOKENS tokens; every other
piece is training text. Each full shard is committed with the manifest, which records where
the next shard starts (document, piece, token offset), so a run that is interrupted,
killed or stopped at `max_tokens` continues there and the files come out byte-identical to
one uninterrupted run.

Writers hold a file lock on the dataset folder: concurrent trials wait for the first one
instead of tokenising the same text twice. Nothing here runs inside a distributed wait.
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from scalelab.jobs.data.shards import (  # fmt: skip
    DEFAULT_SHARD_TOKENS,
    FORMAT,
    VAL_EVERY,
    VAL_MAX_TOKENS,
    Manifest,
    Position,
    ShardWriter,
    Validation,
    dataset_dir,
    dataset_key,
    dtype_for,
    read_manifest,
    remove_unlisted,
    write_atomic,
    write_manifest,
)
from scalelab.jobs.data.sources import TextSource
from scalelab.jobs.data.tokenise import PIECE_CHARS, DocBatch, Encoded, encoded
from scalelab.jobs.data.tokenizers import Tokenizer, load_tokenizer, tokenizer_fingerprint

INLINE_BELOW_BYTES = 32 << 20  # smaller sources are tokenised in this process (no spawn cost)


def dataset_root(source: TextSource, tokenizer: str) -> Path:
    key = dataset_key(source.fingerprint(), source.text_field, tokenizer_fingerprint(tokenizer))
    return dataset_dir(source.spec, tokenizer, key)


def enough(m: Manifest | None, train_tokens: int | None, val_tokens: int = 0) -> bool:
    """Whether `m` holds `train_tokens` training tokens (None: the whole source) and
    `val_tokens` validation tokens, or all the source has."""
    if m is None:
        return False
    if m.complete:
        return True
    val_ok = m.validation.complete or m.validation.tokens >= val_tokens
    return train_tokens is not None and m.train_tokens >= train_tokens and val_ok


def default_workers(source: TextSource) -> int:
    size = source.size_bytes()
    if size is not None and size < INLINE_BELOW_BYTES:
        return 0
    return len(os.sched_getaffinity(0))


def prepare_source(
    source: TextSource,
    tokenizer: str,
    tokenizer_file: str | None = None,
    *,
    max_tokens: int | None = None,
    val_tokens: int = 0,
    workers: int | None = None,
    shard_tokens: int = DEFAULT_SHARD_TOKENS,
    report: Report | None = None,
) -> tuple[Path, Manifest]:
    """Prepare (or continue preparing) `source` until it holds `max_tokens` training tokens
    and `val_tokens` validation tokens (or the source ends). Returns the folder and manifest."""
    from filelock import FileLock, Timeout

    root = dataset_root(source, tokenizer)
    created = not root.exists()
    root.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(root / "lock"))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        print(f"waiting for another process preparing {root} ...", file=sys.stderr, flush=True)
        lock.acquire()
    try:
        root.mkdir(parents=True, exist_ok=True)  # the writer we waited for may have failed
        manifest = read_manifest(root)
        remove_unlisted(root, manifest)
        if enough(manifest, max_tokens, val_tokens):
            return root, manifest  # type: ignore[return-value]
        tok = load_tokenizer(tokenizer, tokenizer_file)
        if manifest is None:
            manifest = _empty_manifest(source, tok, shard_tokens)
        workers = default_workers(source) if workers is None else workers
        build = _Build(root, source, manifest, max_tokens, val_tokens, report or Report(None))
        batches = _doc_batches(source, manifest.next)
        manifest = build.run(encoded(batches, workers, tok, manifest.dtype))
    except BaseException:
        if created and read_manifest(root) is None:  # nothing usable was made: leave no trace
            lock.release()
            _remove_tree(root)
        elif root.is_dir():  # stopped between a shard's rename and the manifest that lists it
            remove_unlisted(root, read_manifest(root))
        raise
    finally:
        if lock.is_locked:
            lock.release()
    return root, manifest


def _empty_manifest(source: TextSource, tok: Tokenizer, shard_tokens: int) -> Manifest:
    rule = (f"pieces whose index is a multiple of {VAL_EVERY} (documents in source order, "
            f"cut at a line break into pieces of at most {PIECE_CHARS:,} characters), until "
            f"the split holds {VAL_MAX_TOKENS:,} tokens")  # fmt: skip
    return Manifest(
        format=FORMAT, source=source.spec, source_fingerprint=source.fingerprint(),
        text_field=source.text_field, tokenizer=tok.name, tokenizer_fingerprint=tok.fingerprint,
        vocab_size=tok.vocab_size, separator=tok.separator, dtype=dtype_for(tok.vocab_size),
        shard_tokens=shard_tokens,
        validation=Validation(rule=rule, every=VAL_EVERY, max_tokens=VAL_MAX_TOKENS,
                              file="val.bin", tokens=0, documents=0, sha256="", complete=False),
        train=[], next=Position(document=0, piece=0, item=0, offset=0), complete=False,
    )  # fmt: skip


class _Build:
    """Routes documents to the validation split or the current train shard and commits."""

    def __init__(self, root: Path, source: TextSource, m: Manifest, max_tokens: int | None,
                 val_tokens: int, report: Report) -> None:  # fmt: skip
        self.root, self.source, self.m, self.report = root, source, m, report
        self.max_tokens, self.val_tokens = max_tokens, val_tokens
        # val.bin only grows; a writer killed between replacing it and the manifest leaves
        # more tokens than the manifest lists: keep the listed prefix, rewrite at the next commit
        path, little = root / m.validation.file, np.dtype(m.dtype).newbyteorder("<")
        stored = np.fromfile(path, dtype=little) if path.is_file() else np.zeros(0, little)
        self.val = [stored[: m.validation.tokens]]
        self.val_len, self.val_docs = m.validation.tokens, m.validation.documents
        self.val_on_disk = len(stored) if path.is_file() else -1
        self.end = (m.next.document, m.next.piece, m.next.item)  # after the last item read
        self.writer: ShardWriter | None = None

    def run(self, batches: Iterator[Encoded]) -> Manifest:
        """Consume encoded batches until enough is prepared or the source ends."""
        start = self.m.next
        item = start.item  # pieces are numbered across the source: the validation rule
        self.report.start(self.source, self.max_tokens, start.document)
        try:
            for b in batches:
                ends = np.cumsum(b.lengths)
                for j, length in enumerate(b.lengths.tolist()):
                    doc, piece, last = int(b.docs[j]), int(b.pieces[j]), bool(b.last[j])
                    self.end = (doc + 1, 0, item + 1) if last else (doc, piece + 1, item + 1)
                    skip = start.offset if item == start.item else 0
                    if self._add((doc, piece, item), b.tokens[ends[j] - length : ends[j]], skip):
                        return self.m
                    item += 1
                self.report.advance(int(ends[-1]) if len(ends) else 0, int(b.last.sum()))
            return self._finish()
        finally:
            batches.close()  # type: ignore[attr-defined]  # stops the worker pool now
            if self.writer is not None:
                self.writer.abort()
            self.report.stop()

    def _add(self, at: tuple[int, int, int], t: np.ndarray, skip: int) -> bool:
        """Add the tokens of the item at `at` (`skip` of them are already in a shard);
        True when enough is prepared."""
        starts_document = at[1] == 0 and len(t) > 0 and skip == 0
        if at[2] % VAL_EVERY == 0 and not self.m.validation.complete:
            self.val.append(t)
            self.val_len += len(t)
            self.val_docs += starts_document
            if self.val_len >= VAL_MAX_TOKENS:
                self.m = self.m.model_copy(update={"validation": self._validation(True)})
            return False
        t = t[skip:]
        if starts_document:
            self._writer().documents += 1
        consumed = skip
        while len(t):
            w = self._writer()
            room = self.m.shard_tokens - w.tokens
            w.write(t[:room])
            consumed += min(room, len(t))
            t = t[room:]
            if w.tokens == self.m.shard_tokens:
                self._commit((*at, consumed) if len(t) else (*self.end, 0))
                if enough(self.m, self.max_tokens, self.val_tokens):
                    return True
        return False

    def _writer(self) -> ShardWriter:
        if self.writer is None:
            name = f"train-{len(self.m.train):06d}.bin"
            self.writer = ShardWriter(self.root / name, self.m.dtype)
        return self.writer

    def _finish(self) -> Manifest:
        """The source is exhausted: commit the last (shorter) shard and the split."""
        if self.writer is not None and self.writer.tokens == 0:
            self.writer.abort()
            self.writer = None
        if not self.m.train and self.writer is None:
            raise ValueError(
                f"data.source {self.source.spec!r} has no training text: "
                f"{self.end[0]} documents gave {self.val_len} tokens (validation takes "
                f"every {VAL_EVERY}th piece); check data.text_field "
                f"{self.source.text_field!r} and the files"
            )
        self._commit((*self.end, 0), complete=True)
        return self.m

    def _validation(self, complete: bool) -> Validation:
        return self.m.validation.model_copy(update={
            "tokens": self.val_len, "documents": self.val_docs, "complete": complete})  # fmt: skip

    def _commit(self, nxt: tuple[int, int, int, int], complete: bool = False) -> None:
        """Commit the current shard (the next starts at `nxt`), the split and the manifest."""
        shards = list(self.m.train)
        if self.writer is not None:
            shards.append(self.writer.commit())
            self.writer = None
        validation = self._validation(self.m.validation.complete or complete)
        if self.val_on_disk != self.val_len:
            little = np.dtype(self.m.dtype).newbyteorder("<")
            data = np.concatenate(self.val).astype(little).tobytes()
            write_atomic(self.root / validation.file, data)
            self.val = [np.frombuffer(data, dtype=little)]
            self.val_on_disk = self.val_len
            validation = validation.model_copy(update={"sha256": hashlib.sha256(data).hexdigest()})
        self.m = self.m.model_copy(update={
            "train": shards, "validation": validation, "complete": complete,
            "next": Position(document=nxt[0], piece=nxt[1], item=nxt[2], offset=nxt[3])})  # fmt: skip
        write_manifest(self.root, self.m)


def _remove_tree(root: Path) -> None:
    import shutil

    shutil.rmtree(root, ignore_errors=True)


def _doc_batches(source: TextSource, start: Position) -> Iterator[DocBatch]:
    doc = start.document
    for texts in source.work(start.document):
        yield DocBatch(texts, doc, start.piece if doc == start.document else 0)
        doc += len(texts)


# ----------------------------------------------------------------------------- progress


class Report:
    """Progress with tokens/s and an ETA: a rich bar on a terminal, else a line every
    `interval` seconds (trial logs)."""

    def __init__(self, title: str | None, interval: float = 30.0) -> None:
        self.title, self.interval = title, interval
        self.bar = None
        self.tokens = self.docs = 0
        self.t0 = self.last = time.monotonic()

    def start(self, source: TextSource, max_tokens: int | None, first_doc: int) -> None:
        self.t0 = self.last = time.monotonic()
        self.tokens = self.docs = 0
        self.total_docs = source.documents()
        self.max_tokens, self.first_doc = max_tokens, first_doc
        if self.title is not None and sys.stderr.isatty():
            from rich.progress import (
                BarColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,  # fmt: skip
            )

            self.bar = Progress(
                TextColumn("{task.description}"), BarColumn(),
                TextColumn("{task.completed:,.0f} tokens"),
                TextColumn("{task.fields[rate]}"), TimeElapsedColumn(), TextColumn("ETA"),
                TimeRemainingColumn(), transient=False,
            )  # fmt: skip
            self.bar.start()
            self.task = self.bar.add_task(self.title, total=None, rate="")

    def _estimate(self) -> int | None:
        """Tokens this run will have made at the end: max_tokens, or extrapolated from the
        documents done when the source says how many it has."""
        if self.max_tokens is not None:
            return self.max_tokens
        if self.total_docs and self.docs:
            return int(self.tokens * (self.total_docs - self.first_doc) / self.docs)
        return None

    def advance(self, tokens: int, docs: int) -> None:
        self.tokens += tokens
        self.docs += docs
        now = time.monotonic()
        rate = self.tokens / max(now - self.t0, 1e-9)
        if self.bar is not None:
            self.bar.update(self.task, completed=self.tokens, total=self._estimate(),
                            rate=f"{rate / 1e6:.2f}M tok/s")  # fmt: skip
        elif now - self.last >= self.interval:
            self.last = now
            total = self._estimate()
            eta = f", ETA {(total - self.tokens) / rate:.0f} s" if total and rate else ""
            print(f"data: {self.tokens:,} tokens, {rate / 1e6:.2f}M tokens/s{eta}",
                  file=sys.stderr, flush=True)  # fmt: skip

    def stop(self) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar = None

    @property
    def rate(self) -> float:
        return self.tokens / max(time.monotonic() - self.t0, 1e-9)
