"""Prepared token data on disk: fixed-size shards and the manifest that vouches for them.

One folder per (source, tokenizer) under data_dir(), shared by every seed, seq_len and
trial (docs/architecture.md, "Data"):

  <source>.<tokenizer>.<key>/     key: sha256 of (FORMAT, source fingerprint, text field,
                                  tokenizer fingerprint), 16 hex digits
    manifest.json                 the truth: only what it lists is data
    train-000000.bin ...          shard_tokens tokens each (a finished source's last shard
                                  may be shorter); raw little-endian uint16 or uint32
    val.bin                       the validation documents' tokens
    lock                          held by whoever is writing

Every file is written to a temporary name, fsynced and renamed, then the manifest is
replaced the same way: an interrupted or failed write leaves the last manifest and the files
it lists intact, and the next run continues from there.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict

from scalelab.contract.workdir import data_dir

if TYPE_CHECKING:
    import numpy as np

FORMAT = 1  # bump when the files change meaning
DEFAULT_SHARD_TOKENS = 1 << 26  # 64M tokens: 128 MiB of uint16
VAL_EVERY = 20  # documents 0, 20, 40, ... are validation documents ...
VAL_MAX_TOKENS = 1 << 22  # ... until the validation split holds this many tokens
MANIFEST = "manifest.json"


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Shard(_Frozen):
    file: str
    tokens: int
    documents: int  # documents whose first token is in this shard
    sha256: str


class Validation(_Frozen):
    rule: str  # how the split was drawn, in words
    every: int
    max_tokens: int
    file: str
    tokens: int
    documents: int
    sha256: str
    complete: bool  # no more documents will be added


class Position(_Frozen):
    """Where the next train shard starts: `offset` tokens into piece `piece` of document
    `document`, the `item`-th piece of the source."""

    document: int
    piece: int
    item: int
    offset: int


class Manifest(_Frozen):
    format: int
    source: str
    source_fingerprint: Any
    text_field: str
    tokenizer: str
    tokenizer_fingerprint: str
    vocab_size: int
    separator: list[int]  # tokens after every document
    dtype: Literal["uint16", "uint32"]
    shard_tokens: int
    validation: Validation
    train: list[Shard]
    next: Position
    complete: bool  # the source is exhausted: every document is in a shard

    @property
    def train_tokens(self) -> int:
        return sum(s.tokens for s in self.train)

    @property
    def documents(self) -> int:
        return sum(s.documents for s in self.train) + self.validation.documents


def dtype_for(vocab_size: int) -> Literal["uint16", "uint32"]:
    if vocab_size > 1 << 32:
        raise ValueError(f"a vocabulary of {vocab_size} tokens does not fit uint32 shards")
    return "uint16" if vocab_size <= 1 << 16 else "uint32"


def dataset_key(source_fingerprint: Any, text_field: str, tokenizer_fingerprint: str) -> str:
    key = [FORMAT, source_fingerprint, text_field, tokenizer_fingerprint]
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def dataset_dir(source: str, tokenizer: str, key: str) -> Path:
    """data_dir()/<source>.<tokenizer>.<key>, readable names for `scalelab data list`."""

    def slug(text: str) -> str:
        text = text.removeprefix("hf:").removeprefix("builtin:").rstrip("/")
        text = "-".join(Path(text).parts[-3:]) if "/" in text else text
        return re.sub(r"[^A-Za-z0-9_-]+", "-", Path(text).stem if "." in text else text)[:48]

    return data_dir() / f"{slug(source) or 'data'}.{slug(tokenizer) or 'tok'}.{key}"


def read_manifest(root: Path) -> Manifest | None:
    path = root / MANIFEST
    return Manifest.model_validate_json(path.read_text()) if path.is_file() else None


def list_prepared() -> list[tuple[Path, Manifest]]:
    root = data_dir()
    found = [(p, read_manifest(p)) for p in sorted(root.iterdir())] if root.is_dir() else []
    return [(p, m) for p, m in found if m is not None]


# ----------------------------------------------------------------------------- writing


class DiskFull(ValueError):
    pass


def _disk_full(path: Path, e: OSError) -> Exception:
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return DiskFull(
            f"disk full while writing {path}: free space there or point SCALELAB_DATA at a "
            "larger filesystem, then run the same command again (it continues from the "
            "shards in manifest.json; nothing half-written was kept)"
        )
    return e


def write_atomic(path: Path, data: bytes) -> None:
    """Write to a temporary name, fsync, rename over `path`; on failure nothing is left."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        with tmp.open("wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise _disk_full(path, e) from None
    _fsync_dir(path.parent)


def write_manifest(root: Path, manifest: Manifest) -> None:
    write_atomic(root / MANIFEST, (manifest.model_dump_json(indent=2) + "\n").encode())


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class ShardWriter:
    """One train shard written as tokens arrive (memory stays one batch, whatever the shard
    size), under a temporary name until `commit`."""

    def __init__(self, path: Path, dtype: str) -> None:
        import numpy as np  # here: reading a manifest (the CLI, a dry-run's data plan) needs none

        self.path, self.dtype = path, np.dtype(dtype)
        self.tmp = path.with_name(path.name + ".tmp")
        self.tokens, self.documents = 0, 0
        self.sha = hashlib.sha256()
        self._file = self._guard(lambda: self.tmp.open("wb", buffering=1 << 22))

    def write(self, tokens: np.ndarray) -> None:
        import numpy as np

        data = np.ascontiguousarray(tokens, dtype=self.dtype.newbyteorder("<")).tobytes()
        self.sha.update(data)
        self._guard(lambda: self._file.write(data))
        self.tokens += len(tokens)

    def commit(self) -> Shard:
        def finish() -> None:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
            os.replace(self.tmp, self.path)

        self._guard(finish)
        _fsync_dir(self.path.parent)
        return Shard(
            file=self.path.name, tokens=self.tokens, documents=self.documents,
            sha256=self.sha.hexdigest(),
        )  # fmt: skip

    def abort(self) -> None:
        if not self._file.closed:
            try:
                self._file.close()
            except OSError:
                pass  # the disk is full: the buffered bytes go with the file
        self.tmp.unlink(missing_ok=True)

    def _guard(self, fn: Any) -> Any:
        try:
            return fn()
        except OSError as e:
            if hasattr(self, "_file"):
                self.abort()
            raise _disk_full(self.path, e) from None


def remove_unlisted(root: Path, manifest: Manifest | None) -> None:
    """Delete what a killed writer left behind: temporary files and shards not yet listed."""
    keep = {MANIFEST, "lock"}
    if manifest is not None:
        keep |= {s.file for s in manifest.train} | {manifest.validation.file}
    for p in root.iterdir():
        if p.name not in keep and (p.name.endswith((".tmp", ".bin"))):
            p.unlink()
