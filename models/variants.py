"""Named mechanism combinations ('dense', 'hadamard', 'budget+tsa', ...), torch-free.

A variant name is the '+'-joined list of mechanisms in canonical order; it maps to the
ModelConfig fields that switch those mechanisms on with their default settings.
"""

from __future__ import annotations

from itertools import combinations
from typing import Any

MECHANISMS: dict[str, dict[str, Any]] = {
    "hadamard": {"attn_out": "hadamard"},
    "budget": {"budget": {}},
    "tsa": {"tsa": {}},
}


def canonical_variant(name: str) -> str:
    """'tsa+hadamard' -> 'hadamard+tsa'; unknown mechanisms are an error."""
    parts = [p.strip() for p in name.split("+") if p.strip()]
    if parts == ["dense"]:
        return "dense"
    unknown = [p for p in parts if p not in MECHANISMS]
    if unknown or not parts or len(set(parts)) != len(parts):
        raise ValueError(f"unknown variant {name!r}; allowed: {', '.join(all_variants())}")
    return "+".join(m for m in MECHANISMS if m in parts)


def variant_fields(name: str) -> dict[str, Any]:
    """The ModelConfig fields that a variant sets."""
    canonical = canonical_variant(name)
    fields: dict[str, Any] = {}
    if canonical != "dense":
        for mechanism in canonical.split("+"):
            fields.update(MECHANISMS[mechanism])
    return fields


def all_variants() -> list[str]:
    names = ["dense"]
    for r in range(1, len(MECHANISMS) + 1):
        names += ["+".join(c) for c in combinations(MECHANISMS, r)]
    return names
