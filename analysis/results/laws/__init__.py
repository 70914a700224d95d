"""The fit laws `scalelab results fit` fits to each variant's trials, in order: their
tables, `--json` keys and report sections follow it (docs/scaling.md has the equations).

A new law is one module in this folder, a subclass of `Law` (base.py: its name, form,
constants and `fit`; the tables, JSON and report entries have defaults), and one line in
BUILT_IN below. Outside scalelab (a notebook, a test), `register(law)` adds one to every
fit made after it, `unregister(name)` takes it out.
"""

from __future__ import annotations

from dataclasses import replace

from .base import FitOptions, Law, LawFit, Skipped, VariantTrials
from .chinchilla_law import Chinchilla
from .isoflop_law import IsoFlop
from .loss_vs_compute import LossVsCompute

BUILT_IN: tuple[Law, ...] = (
    LossVsCompute(),  # L(C) through each variant's compute frontier
    Chinchilla(),  # L(N, D), and the compute-optimal allocation from it
    IsoFlop(),  # IsoFLOP optima
)
_REGISTERED: list[Law] = list(BUILT_IN)


def register(law: Law) -> Law:
    """Fit `law` too, after the laws registered before it; a name already taken is refused
    (ValueError)."""
    if not law.name:
        raise ValueError(f"{type(law).__name__}: a law needs a name (its --json key)")
    if any(known.name == law.name for known in _REGISTERED):
        raise ValueError(f"a law named {law.name!r} is registered already")
    _REGISTERED.append(law)
    return law


def unregister(name: str) -> None:
    """Fit the law named `name` no more (a built-in one too)."""
    _REGISTERED[:] = [law for law in _REGISTERED if law.name != name]


def registered() -> list[Law]:
    """The laws every fit fits, in their order."""
    return list(_REGISTERED)


def law_named(name: str) -> Law | None:
    return next((law for law in _REGISTERED if law.name == name), None)


def fit_law(law: Law, trials: VariantTrials) -> LawFit | None:
    """`law` through one variant's trials, into `trials.fit.law_fits[law.name]`; a failure
    or a skip is a note ('<label> of <variant>: why'). With --exclude-outliers, a law that
    asks for it is fitted again without the trials its check flags (named by their ids), as
    "<variant> without outliers" (whether it applies is not asked again)."""
    if not law.applies(trials):
        return None
    found = _fitted(law, trials)
    check = found.check if found is not None else None
    if trials.options.exclude_outliers and law.refit_without_outliers and check and check.outliers:
        import pyarrow as pa

        flagged = [o.label for o in check.outliers]
        drop = set(flagged)
        kept = pa.array([i not in drop for i in trials.ids])
        name = f"{trials.variant} without outliers"
        again = replace(trials, variant=name, table=trials.table.filter(kept))
        if _fitted(law, again) is not None:
            trials.note(
                f"{name}: refitted without {len(flagged)} flagged point(s): " + ", ".join(flagged)
            )
    return found


def _fitted(law: Law, trials: VariantTrials) -> LawFit | None:
    """law.fit, its failure or skip a note; its fit recorded under the trials' variant."""
    what = f"{law.label or law.name} of {trials.variant}"
    found = trials.attempt(what, lambda: law.fit(trials))
    if isinstance(found, Skipped):
        trials.note(f"{what}: {found.reason}")
        return None
    if found is not None:
        trials.fit.law_fits.setdefault(law.name, {})[trials.variant] = found
    return found


__all__ = [
    "BUILT_IN",
    "FitOptions",
    "Law",
    "LawFit",
    "Skipped",
    "VariantTrials",
    "fit_law",
    "law_named",
    "register",
    "registered",
    "unregister",
]
