"""Scaling fits of one synced sweep (orchestrator.scaling on the `trials` table).

Uses FINISHED trials with a finite final loss; everything left out is said in `notes`.
Per variant: L(C) = E + A C^-alpha with bootstrap intervals and its Pareto frontier;
Chinchilla's L(N, D) when the variant has >= 3 distinct N and D; IsoFLOP parabolas when
the sweep has an isoflop axis (>= 2 nominal budgets, `budget_flops`). Against the baseline:
the compute-equivalent gain of each variant with its interval, and per-size differences.
A part that the data cannot support is skipped with the reason; if no law at all can be
fitted, `fit_sweep` raises ResultsError (e.g. a sweep with one size).
"""

from __future__ import annotations

import math
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .query import load
from .store import ResultsError

if TYPE_CHECKING:
    import pyarrow as pa

    from orchestrator.scaling import Bootstrap, CellComparison, Gain, IsoFlopFit

LOSS = "final_val_loss"


@dataclass
class SweepFit:
    sweep: str
    baseline: str
    loss: str
    level: float
    n_trials: int
    n_used: int
    variants: list[str]
    table: pa.Table  # the trials used (FINISHED, finite loss)
    laws: dict[str, Bootstrap] = field(default_factory=dict)  # L(C) per variant
    frontier: dict[str, list[str]] = field(default_factory=dict)  # trial ids by compute
    chinchilla: dict[str, Bootstrap] = field(default_factory=dict)
    isoflop: dict[str, IsoFlopFit] = field(default_factory=dict)
    gains: list[Gain] = field(default_factory=list)
    axes: tuple[str, ...] = ()  # the swept axes that define a cell (design.py)
    cells: list[CellComparison] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "sweep": self.sweep,
            "baseline": self.baseline,
            "loss": self.loss,
            "level": self.level,
            "n_trials": self.n_trials,
            "n_used": self.n_used,
            "variants": self.variants,
            "power_law": {v: _boot(b) for v, b in self.laws.items()},
            "frontier": self.frontier,
            "chinchilla": {v: _boot(b) for v, b in self.chinchilla.items()},
            "isoflop": {
                v: {
                    "a": f.a,
                    "b": f.b,
                    "k_n": f.k_n,
                    "k_d": f.k_d,
                    "budgets": [{k: _num(x) for k, x in vars(o).items()} for o in f.budgets],
                }
                for v, f in self.isoflop.items()
            },  # fmt: skip
            "gains": [
                {
                    "variant": g.variant,
                    "baseline": g.baseline,
                    "multiplier": _interval(g.multiplier),
                    "reference_loss": _num(g.reference_loss),
                    "reference_flops": _num(g.reference_flops),
                    "shared_E": g.shared_E,
                    "resamples_ok": g.n_resamples - g.n_failed,
                    "text": str(g),
                }
                for g in self.gains
            ],
            "axes": list(self.axes),
            "cells": [
                {
                    "cell": {k: _num(v) for k, v in c.cell},
                    "variant": c.variant,
                    "loss": _num(c.loss),
                    "baseline_loss": _num(c.baseline_loss),
                    "loss_diff": _num(c.loss_diff),
                    "loss_diff_se": _num(c.loss_diff_se),
                    "n_pairs": c.n_pairs,
                    "params_ratio": _num(c.params_ratio),
                    "flops_ratio": _num(c.flops_ratio),
                    "n_trials": c.n_trials,
                    "baseline_n_trials": c.baseline_n_trials,
                }
                for c in self.cells
            ],
            "notes": self.notes,
        }


def _num(x: Any) -> Any:
    """JSON-safe: inf/nan become strings ('inf' = never reached), not a silent number."""
    if isinstance(x, (float, np.floating)):
        return float(x) if math.isfinite(x) else str(float(x))
    if isinstance(x, (np.integer,)):
        return int(x)
    return x


def _interval(i: Any) -> dict[str, Any]:
    return {
        "estimate": _num(i.estimate),
        "low": _num(i.low),
        "high": _num(i.high),
        "level": i.level,
    }


def _boot(b: Bootstrap) -> dict[str, Any]:
    out = {k: _interval(v) for k, v in b.intervals.items()}
    out["n_trials"] = b.point.n_trials
    out["resamples_ok"] = b.n_resamples - b.n_failed
    return out


def usable_trials(table: pa.Table, loss: str, notes: list[str]) -> pa.Table:
    """FINISHED trials with a finite loss; what is left out goes into `notes`."""
    import pyarrow.compute as pc

    if table.num_rows == 0:
        raise ResultsError("the sweep has no trials (empty sweep)")
    status = table["status"].to_pylist()
    not_done = [s for s in status if s != "FINISHED"]
    if len(not_done) == len(status):
        counts = ", ".join(f"{n} {s}" for s, n in sorted(Counter(not_done).items()))
        raise ResultsError(f"no FINISHED trials yet ({counts}); nothing to fit")
    if not_done:
        counts = ", ".join(f"{n} {s}" for s, n in sorted(Counter(not_done).items()))
        notes.append(f"left out {len(not_done)} trials that are not FINISHED ({counts})")
    done = table.filter(pc.equal(table["status"], "FINISHED"))
    y = done[loss].to_numpy(zero_copy_only=False).astype(float)
    bad = ~np.isfinite(y)
    if bad.all():
        raise ResultsError(
            f"all {y.size} FINISHED trials have a NaN/missing {loss} (diverged?); nothing to fit"
        )
    if bad.any():
        ids = [done["trial_id"][int(i)].as_py() for i in np.flatnonzero(bad)]
        notes.append(
            f"left out {int(bad.sum())} FINISHED trials with NaN/missing {loss}: {', '.join(ids[:8])}"
            + (" ..." if len(ids) > 8 else "")
        )
        done = done.filter(np.isfinite(y))
    return done


def fit_sweep(
    sweep: str,
    *,
    baseline: str = "dense",
    loss: str = LOSS,
    n_resamples: int = 1000,
    level: float = 0.95,
    seed: int = 0,
    root: Path | None = None,
) -> SweepFit:
    """All the fits the sweep's data supports (module doc). Needs a prior `sync`."""
    return fit_table(
        load(sweep, "trials", root), sweep, baseline=baseline, loss=loss,
        n_resamples=n_resamples, level=level, seed=seed,
    )  # fmt: skip


def fit_table(
    table: pa.Table,
    sweep: str,
    *,
    baseline: str = "dense",
    loss: str = LOSS,
    n_resamples: int = 1000,
    level: float = 0.95,
    seed: int = 0,
) -> SweepFit:
    from orchestrator.scaling import ScalingError, ScalingWarning

    if loss not in table.column_names:
        raise ResultsError(f"unknown loss column {loss!r} (use final_val_loss or best_val_loss)")
    notes: list[str] = []
    used = usable_trials(table, loss, notes)
    variants = sorted(set(used["variant"].to_pylist()))
    if baseline not in variants and len(variants) > 1:
        raise ResultsError(
            f"no baseline: variant {baseline!r} has no finished trials in sweep {sweep!r} "
            f"(variants: {', '.join(variants)}); choose one with --baseline"
        )
    fit = SweepFit(sweep, baseline, loss, level, table.num_rows, used.num_rows, variants, used)
    fit.notes.extend(notes)

    def attempt(what: str, fn: Any) -> Any:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                return fn()
            except ScalingError as e:
                fit.notes.append(f"{what}: {e}")
                return None
            finally:
                # ScalingWarnings say what was dropped; numpy's RuntimeWarnings inside
                # the optimiser's line search are not news for the reader
                fit.notes.extend(
                    f"{what}: {w.message}" for w in caught if issubclass(w.category, ScalingWarning)
                )

    boot_opts = {"n_resamples": n_resamples, "level": level, "seed": seed}
    for v in variants:
        rows = used.filter(_eq(used, "variant", v))
        c = _col(rows, "flops")
        y = _col(rows, loss)
        ids = rows["trial_id"].to_pylist()
        from orchestrator.scaling import (
            bootstrap,
            fit_chinchilla,
            fit_isoflop,
            fit_power_law,
            pareto_frontier,
        )

        front = attempt(f"frontier of {v}", lambda c=c, y=y: pareto_frontier(c, y))
        if front is not None:
            fit.frontier[v] = [ids[i] for i in front]
        # Resample within each size: every draw keeps the ladder's design (all sizes), so
        # a small sweep does not lose its fit to draws that miss a size.
        sizes = np.asarray(rows["size"].to_pylist())
        law = attempt(
            f"L(C) of {v}",
            lambda c=c, y=y, sizes=sizes: bootstrap(fit_power_law, c, y, strata=sizes, **boot_opts),
        )
        if law is not None:
            fit.laws[v] = law
        n, d = _col(rows, "n_params"), _col(rows, "tokens")
        if np.unique(n).size >= 3 and np.unique(d).size >= 3 and rows.num_rows >= 6:
            ch = attempt(
                f"Chinchilla L(N, D) of {v}",
                lambda n=n, d=d, y=y: bootstrap(fit_chinchilla, n, d, y, **boot_opts),
            )
            if ch is not None:
                fit.chinchilla[v] = ch
        budgets = _col(rows, "budget_flops") if "budget_flops" in rows.column_names else None
        if budgets is not None and np.isfinite(budgets).all() and np.unique(budgets).size >= 2:
            iso = attempt(
                f"IsoFLOP of {v}", lambda b=budgets, n=n, y=y, d=d: fit_isoflop(b, n, y, tokens=d)
            )
            if iso is not None:
                fit.isoflop[v] = iso
    if not fit.laws and not fit.chinchilla and not fit.isoflop:
        sizes = sorted(set(used["size"].to_pylist()))
        why = (
            f"one size ({sizes[0]}): no fit possible"
            if len(sizes) == 1
            else (fit.notes[-1] if fit.notes else "too few trials")
        )
        raise ResultsError(f"no scaling law could be fitted for sweep {sweep!r}: {why}")
    if len(variants) > 1:
        from orchestrator.scaling import Trials, compare_cells, compute_equivalent_gain

        from .design import read_design

        base = Trials.from_table(used, baseline, loss=loss)
        for v in variants:
            if v == baseline:
                continue
            g = attempt(
                f"gain of {v} vs {baseline}",
                lambda v=v: compute_equivalent_gain(
                    Trials.from_table(used, v, loss=loss), base, **boot_opts
                ),
            )
            if g is not None:
                fit.gains.append(g)
        design = read_design(used)
        fit.axes = design.axes
        cells = attempt(
            "per-cell comparison",
            lambda: compare_cells(
                design.table, baseline=baseline, loss=loss, axes=design.axes, arms=design.arms
            ),
        )
        fit.cells = cells or []
    else:
        fit.notes.append(f"only one variant ({variants[0]}): no gains to compute")
    return fit


def _eq(table: pa.Table, column: str, value: str) -> Any:
    import pyarrow.compute as pc

    return pc.equal(table[column], value)


def _col(table: pa.Table, name: str) -> np.ndarray:
    return table[name].to_numpy(zero_copy_only=False).astype(float)
