"""Environment variables set for a while, not for the rest of the process: what a
process sets in os.environ reaches every child it starts later (a driver, a trial); and the
one a SLURM job sets for its whole life, Triton's node-local kernel cache."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def scoped_environ(values: dict[str, str], restore: tuple[str, ...] = ()) -> Iterator[None]:
    """os.environ with `values` set; those and the `restore` variables are put back after."""
    saved = {key: os.environ.get(key) for key in (*values, *restore)}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old


TRITON_CACHE_ENV = "TRITON_CACHE_DIR"


def node_local_triton_cache() -> str:
    """Point Triton's kernel cache at a node-local folder, unless the user chose one; the
    folder. Triton's default, ~/.triton/cache, is on a cluster's shared home (NFS), where
    every rank of every node compiling at once is slow and its file locking unreliable.
    $TMPDIR (per job on many clusters) or /tmp, one folder per user."""
    if not os.environ.get(TRITON_CACHE_ENV):
        base = os.environ.get("TMPDIR") or "/tmp"
        os.environ[TRITON_CACHE_ENV] = os.path.join(base, f"scalelab-triton-{os.getuid()}")
    return os.environ[TRITON_CACHE_ENV]
