"""Sizes and SHA-256 digests of a checkpoint's files, recorded at save time and compared
before any of them is read back, so a truncated, bit-flipped, missing or swapped file is
found and named before torch ever opens it.

A checkpoint at ladder scale is tens of files of very different sizes (one model file of
~11 GB beside one optimizer shard per rank), so the files are shared out by size (`share`:
largest first, each to the least loaded rank) and each rank hashes its share on several
threads (`digests`): hashlib releases the GIL while it digests a chunk, so the threads run
in parallel, bounded by the disk."""

from __future__ import annotations

import hashlib
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

CHUNK = 1 << 22  # 4 MiB reads: SHA-256 runs at disk/page-cache speed (~0.7-2 GB/s a core)


def digest(path: Path) -> dict[str, int | str]:
    """{"size": bytes, "sha256": hex digest} of one file, read in chunks."""
    sha, size = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            sha.update(chunk)
            size += len(chunk)
    return {"size": size, "sha256": sha.hexdigest()}


def hash_threads(ranks_on_node: int = 1) -> int:
    """Threads one of `ranks_on_node` ranks hashes with: its share of this node's cores."""
    return max(1, len(os.sched_getaffinity(0)) // max(1, ranks_on_node))


def digests(folder: Path, names: list[str], threads: int = 1) -> dict[str, dict[str, int | str]]:
    """The digest of each of `names`, `threads` files at a time."""
    if threads <= 1 or len(names) <= 1:
        return {name: digest(folder / name) for name in names}
    with ThreadPoolExecutor(min(threads, len(names)), thread_name_prefix="sha256") as pool:
        return dict(zip(names, pool.map(lambda n: digest(folder / n), names), strict=True))


def share(sizes: dict[str, int], rank: int, world_size: int) -> list[str]:
    """The names `rank` hashes: files by size, largest first, each to the rank with the
    fewest bytes so far (ties to the lower rank), so every rank computes the same split."""
    loads = [0] * world_size
    mine = []
    for name in sorted(sizes, key=lambda n: (-sizes[n], n)):
        least = min(range(world_size), key=lambda r: (loads[r], r))
        loads[least] += sizes[name]
        if least == rank:
            mine.append(name)
    return mine


def mismatches(folder: Path, recorded: dict[str, dict], names: list[str],
               threads: int = 1) -> list[str]:  # fmt: skip
    """One line per file of `names` that is missing or differs from its record."""
    found, to_hash = [], []
    for name in names:
        path, want = folder / name, recorded[name]
        if not path.is_file():
            found.append(f"{path} is missing")
            continue
        size = path.stat().st_size
        if size != want["size"]:
            found.append(f"{path} has {size} bytes, {want['size']} were written")
        else:
            to_hash.append(name)
    for name, got in digests(folder, to_hash, threads).items():
        if got["sha256"] != recorded[name]["sha256"]:
            found.append(f"{folder / name} has a different SHA-256 than was written")
    return found


def unrecorded(folder: Path, recorded: dict[str, dict], ignore: set[str]) -> list[str]:
    """Files in `folder` that were not written with it (a loader's glob could pick them)."""
    return [
        f"{p} was not written with this checkpoint"
        for p in sorted(folder.iterdir())
        if p.is_file() and p.name not in recorded and p.name not in ignore
    ]
