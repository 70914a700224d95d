"""Code outside scalelab that a user names for scalelab to load: the modules an environment
variable lists (comma-separated importable names), and the classes each defines of a kind
(`SCALELAB_MECHANISMS`: models/catalog.py; `SCALELAB_BACKENDS`:
orchestrator/backends/registry.py). Only the environment names code to import, never a
sweep or trial file (docs/reliability.md, "What a sweep file or a trial folder can make
scalelab run"). Stdlib only."""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Iterator
from typing import TypeVar

T = TypeVar("T")


def named_modules(variable: str) -> list[str]:
    """The module names `variable` lists, in order, blanks left out."""
    return [m.strip() for m in os.environ.get(variable, "").split(",") if m.strip()]


def defined_classes(
    variable: str, base: type[T], loaded: set[str], wanted: Callable[[type[T]], bool]
) -> Iterator[type[T]]:
    """Every subclass of `base` defined (not imported) by the modules `variable` names and
    not in `loaded` yet, that `wanted` keeps; each module is imported once and added to
    `loaded` once its classes are taken."""
    for name in named_modules(variable):
        if name in loaded:
            continue
        module = importlib.import_module(name)
        for value in list(vars(module).values()):
            if (
                isinstance(value, type)
                and issubclass(value, base)
                and value.__module__ == module.__name__
                and wanted(value)
            ):
                yield value
        loaded.add(name)
