"""Prepared token data kept in object storage too (`storage:`; contract/storage.py), so that
a node that never saw the data fetches it instead of tokenising the source again
(docs/running-on-ray.md, 'Storage without a shared filesystem').

Pushing (`scalelab data prepare ... --storage URI`, under the dataset folder's lock): the
remote manifest.json is deleted first, then every file the local manifest lists goes up
(one already there with the same SHA-256 and size is kept), then the manifest, last. An
upload cut short leaves files without a manifest, and a folder without a manifest is not
data.

Fetching (a trial with `storage` whose data is not prepared here, or holds fewer tokens
than it needs; every rank of a node may call it: the first does the work under the
folder's lock, the others then find it done): the remote manifest first, checked (its
format, its key is the folder's, its file names are shard names, and it continues the
local manifest if there is one), then only the files it lists that are not here already,
into a staging folder, each checked against the manifest's size (tokens x dtype) and
SHA-256, then renamed into place and the manifest written last. Anything that does not
check out is one warning line and the data is prepared here as without `storage`.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pyarrow.fs as pafs
from pydantic import ValidationError

from scalelab.contract.storage import DATA_DIR, data_prefix
from scalelab.jobs.data.prepare import enough
from scalelab.jobs.data.shards import (  # fmt: skip
    FORMAT,
    MANIFEST,
    Manifest,
    dataset_key,
    read_manifest,
    write_atomic,
)
from scalelab.jobs.object_store import Objects
from scalelab.jobs.training.checksums import digest

log = logging.getLogger(__name__)
STAGING = ".remote"  # a download in progress, inside the dataset folder
SHARD_NAME = re.compile(r"^train-\d{6}\.bin$")
VAL_NAME = "val.bin"


class RemoteData(Objects):
    """The dataset folder `folder` (its name under data_dir()) in the storage at `uri`."""

    def __init__(self, uri: str, folder: str) -> None:
        super().__init__(uri)
        self.root = data_prefix(self.base, folder)
        self.uri = f"{self.base_uri}/{DATA_DIR}/{folder}"  # for messages

    def push(self, root: Path) -> Manifest:
        """Upload the prepared folder `root`, its manifest last; returns what went up."""
        from filelock import FileLock

        with FileLock(str(root / "lock")):  # no prepare changes it meanwhile
            raw = (root / MANIFEST).read_bytes() if (root / MANIFEST).is_file() else None
            if raw is None:
                raise ValueError(f"{root} has no {MANIFEST}: nothing is prepared there")
            m = Manifest.model_validate_json(raw)
            old = self._manifest()
            if self._exists(f"{self.root}/{MANIFEST}"):
                self.fs.delete_file(f"{self.root}/{MANIFEST}")  # not data until it is whole
            there = _files(old) if isinstance(old, Manifest) else {}
            for name, (size, sha) in _files(m).items():
                info = self.fs.get_file_info(f"{self.root}/{name}")
                if there.get(name) != (size, sha) or info.size != size:
                    self._put_file(root / name, f"{self.root}/{name}")
            self._put_bytes(raw, f"{self.root}/{MANIFEST}")
        return m

    def fetch(self, root: Path, train: int | None, val: int) -> bool:
        """Fetch the remote dataset into `root` unless `root` already holds `train` and
        `val` tokens; True if it came. Never raises for the storage or its contents: a
        problem is one warning line and `root` is left as it was."""
        from filelock import FileLock

        root.mkdir(parents=True, exist_ok=True)
        with FileLock(str(root / "lock")):
            local = read_manifest(root)
            if enough(local, train, val):
                return False  # another rank or trial fetched (or prepared) it meanwhile
            try:
                problem = self._fetch(root, local)
            except OSError as e:
                problem = f"{type(e).__name__}: {e}"
            if problem is None:
                log.warning("prepared data fetched from %s", self.uri)
                return True
            if problem:
                log.warning("data in %s not used (preparing it here): %s", self.uri, problem)
            return False

    def _manifest(self) -> Manifest | str | None:
        """The remote manifest, what is wrong with it, or None where there is none."""
        raw = self._get_bytes(f"{self.root}/{MANIFEST}")
        if raw is None:
            return None
        try:
            return Manifest.model_validate_json(raw)
        except ValidationError as e:
            return f"its {MANIFEST} is not a manifest: {e.errors()[0]['msg']}"

    def _fetch(self, root: Path, local: Manifest | None) -> str | None:
        """Download into place; None when fetched, '' when there is nothing newer to fetch,
        else the problem that kept it out."""
        m = self._manifest()
        if m is None:
            listed = self.fs.get_file_info(pafs.FileSelector(self.root, allow_not_found=True))
            return f"no {MANIFEST} (an upload cut short)" if listed else ""
        if isinstance(m, str):
            return m
        problem = _inconsistent(m, root.name, local)
        if problem or not _ahead(m, local):
            return problem
        staging = root / STAGING
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        try:
            have = _files(local) if local is not None else {}
            wanted = {n: f for n, f in _files(m).items() if have.get(n) != f}
            for name, (size, sha) in wanted.items():
                try:
                    self._get_file(f"{self.root}/{name}", staging / name)
                except FileNotFoundError:
                    return f"{name} is missing"
                got = digest(staging / name)
                if got["size"] != size:
                    return f"{name} has {got['size']} bytes, its manifest says {size}"
                if got["sha256"] != sha:
                    return f"{name} has a different SHA-256 from its manifest's"
            for name in wanted:
                os.replace(staging / name, root / name)
            write_atomic(root / MANIFEST, m.model_dump_json(indent=2).encode() + b"\n")
            return None
        finally:
            shutil.rmtree(staging, ignore_errors=True)


def fetch(uri: str, root: Path, train: int | None, val: int) -> bool:
    return RemoteData(uri, root.name).fetch(root, train, val)


def _files(m: Manifest) -> dict[str, tuple[int, str]]:
    """Each file `m` lists: (bytes, SHA-256)."""
    itemsize = np.dtype(m.dtype).itemsize
    files = {s.file: (s.tokens * itemsize, s.sha256) for s in m.train}
    v = m.validation
    return files | {v.file: (v.tokens * itemsize, v.sha256)}


def _inconsistent(m: Manifest, folder: str, local: Manifest | None) -> str:
    """What makes `m` not this folder's data ('' if nothing)."""
    if m.format != FORMAT:
        return f"its {MANIFEST} is format {m.format}, this version reads {FORMAT}"
    if (
        dataset_key(m.source_fingerprint, m.text_field, m.tokenizer_fingerprint)
        != (folder.rsplit(".", 1)[-1])
    ):
        return f"its {MANIFEST} describes other data (its key is not the folder's)"
    names = [s.file for s in m.train]
    if m.validation.file != VAL_NAME or not all(SHARD_NAME.match(n) for n in names):
        return f"its {MANIFEST} lists files that are not shard names"
    if len(set(names)) != len(names):
        return f"its {MANIFEST} lists a shard twice"
    if local is not None and list(m.train[: len(local.train)]) != list(local.train):
        return "its shards are not a continuation of the ones prepared here"
    if local is not None and m.validation.tokens < local.validation.tokens:
        return "it holds fewer validation tokens than are prepared here"
    return ""


def _ahead(m: Manifest, local: Manifest | None) -> bool:
    """Whether `m` holds more than `local`."""
    if local is None:
        return True
    return (
        (m.complete and not local.complete)
        or m.train_tokens > local.train_tokens
        or (m.validation.tokens > local.validation.tokens)
    )
