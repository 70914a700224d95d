"""The door to the mechanism registry: names, variants, defaults, columns and plots.

Torch-free to import; the first call loads the built-in mechanisms (real imports, below) and
the modules named in the SCALELAB_MECHANISMS environment variable (comma-separated importable
modules: every Mechanism they define is registered). Only the environment names code to
import, never a sweep or trial file. Nothing is cached that `register`/`unregister` could
leave stale: every answer is read from the registry when asked.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

from scalelab.contract.plugins import defined_classes
from scalelab.models.mechanism import (
    DENSE,
    Column,
    Component,
    Mechanism,
    MetricPlot,
    Seam,
    register,
    registry,
)

MECHANISMS_ENV = "SCALELAB_MECHANISMS"
_loaded: set[str] = set()  # modules whose mechanisms were registered by _load


def _load() -> None:
    if "builtin" not in _loaded:
        from scalelab.models import budget, hadamard, tsa

        for mechanism in (hadamard.Hadamard, budget.BudgetFormer, tsa.TokenSelective):
            register(mechanism)
        _loaded.add("builtin")
    for mechanism in defined_classes(MECHANISMS_ENV, Mechanism, _loaded, _declares_config):
        register(mechanism)


def _declares_config(mechanism: type[Mechanism]) -> bool:
    return "config" in mechanism.__dict__  # a mechanism, not a base it derives from


def mechanisms() -> tuple[Mechanism, ...]:
    """Every registered mechanism, in variant-name order."""
    _load()
    return tuple(m() for m in sorted(registry().values(), key=lambda m: m.order))


def get(name: str) -> Mechanism | None:
    _load()
    found = registry().get(name)
    return found() if found else None


def default(seam: Seam) -> Component:
    """The dense component at a seam."""
    from scalelab.models.dense import AllBlocks, AllHeads, DenseOutputMixing

    return {
        Seam.OUTPUT_MIXING: DenseOutputMixing,
        Seam.HEAD_SELECTION: AllHeads,
        Seam.DEPTH_ROUTING: AllBlocks,
    }[seam]()


def variants() -> list[str]:
    """'dense' and every combination of mechanisms with at most one per seam."""
    found = mechanisms()
    names = [DENSE]
    for r in range(1, len(found) + 1):
        for combo in itertools.combinations(found, r):
            if len({m.seam for m in combo}) == r:
                names.append("+".join(m.name for m in combo))
    return names


def canonical_variant(name: str) -> str:
    """'tsa+hadamard' -> 'hadamard+tsa'; unknown or clashing mechanisms are an error."""
    parts = [p.strip() for p in name.split("+") if p.strip()]
    if parts == [DENSE]:
        return DENSE
    chosen = [get(p) for p in parts]
    if not parts or None in chosen or len({m.seam for m in chosen}) != len(parts):
        from scalelab.contract.config import did_you_mean

        known = variants()
        close = did_you_mean(name, known)
        raise ValueError(f"unknown variant {name!r}{close}; allowed: {', '.join(known)}")
    return "+".join(m.name for m in sorted(chosen, key=lambda m: m.order))


def variant_settings(name: str, base_model: Mapping[str, Any]) -> dict[str, Any]:
    """`model.<mechanism>` of every mechanism for a variant: the base's settings (or {})
    for those it switches on, None for the others."""
    on = set(canonical_variant(name).split("+"))
    return {m.name: (base_model.get(m.name) or {}) if m.name in on else None for m in mechanisms()}


def variant_fields(name: str) -> dict[str, dict]:
    """The `model` keys that switch a variant's mechanisms on with their defaults."""
    return {k: v for k, v in variant_settings(name, {}).items() if v is not None}


def metric_prefixes() -> tuple[str, ...]:
    return tuple(f"{m.name}/" for m in mechanisms())


def columns() -> tuple[tuple[Mechanism, Column], ...]:
    return tuple((m, c) for m in mechanisms() for c in m.columns)


def plots() -> tuple[MetricPlot, ...]:
    return tuple(p for m in mechanisms() for p in m.plots)
