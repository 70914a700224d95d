"""Test-only mechanisms made in one line: a name, the dense component whose seam it takes
(AllHeads, AllBlocks, ...), its place in variant names and what it declares (methods as
functions, class attributes as values); its config has no fields."""

from __future__ import annotations

from typing import Any

from scalelab.models.mechanism import Component, Mechanism, MechanismConfig


def mechanism(name: str, seam: type[Component], order: int, **declared: Any) -> type[Mechanism]:
    config = type(f"{name}_config", (MechanismConfig,), {"__module__": __name__})
    members = {"name": name, "config": config, "order": order, "__module__": __name__}
    return type(name, (Mechanism, seam), {**members, **declared})
