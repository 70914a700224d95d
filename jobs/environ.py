"""Environment variables set for a while, not for the rest of the process: what a
process sets in os.environ reaches every child it starts later (a driver, a trial)."""

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
