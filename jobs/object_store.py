"""Whole objects to and from a `pyarrow.fs` filesystem (`storage:`; contract/storage.py):
what jobs/training/remote_checkpoints.py and jobs/data/remote_data.py both copy with. An S3
object appears whole or not at all (a multipart upload is committed by its last request),
so each copy below is all-or-nothing remotely; the callers order them (a marker last)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow.fs as pafs

CHUNK = 1 << 22


class Objects:
    """The storage at `uri`: its filesystem and the root path below it."""

    def __init__(self, uri: str) -> None:
        self.fs, self.base = pafs.FileSystem.from_uri(uri)
        self.base_uri = uri.split("?", 1)[0].rstrip("/")  # for messages: no query options

    def _exists(self, path: str) -> bool:
        return self.fs.get_file_info(path).type == pafs.FileType.File

    def _put_file(self, src: Path, dest: str) -> None:
        with open(src, "rb") as f, self.fs.open_output_stream(dest) as out:
            shutil.copyfileobj(f, out, CHUNK)

    def _put_bytes(self, data: bytes, dest: str) -> None:
        with self.fs.open_output_stream(dest) as out:
            out.write(data)

    def _get_file(self, src: str, dest: Path) -> None:
        with self.fs.open_input_stream(src) as f, open(dest, "wb") as out:
            shutil.copyfileobj(f, out, CHUNK)

    def _get_bytes(self, src: str) -> bytes | None:
        try:
            with self.fs.open_input_stream(src) as f:
                return f.read()
        except FileNotFoundError:
            return None
