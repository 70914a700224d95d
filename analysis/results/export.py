"""A SweepFit as strict JSON (`scalelab results fit --json`): no NaN or inf leaks, 'inf'
and 'nan' are strings ('inf' = never reached), every estimate with its interval."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import laws
from .json_values import interval, num

if TYPE_CHECKING:
    from .fit import SweepFit

__all__ = ["advice_dict", "interval", "num", "sweep_fit_dict"]

# --json's first keys, in the order they were printed before the laws were registered; the
# keys of the laws registered after the built-in ones follow (before "gains")
FIRST_KEYS = ("sweep", "baseline", "loss", "level", "n_trials", "n_used", "variants",
              "power_law", "frontier", "chinchilla", "allocation", "huber_delta", "where",
              "isoflop")  # fmt: skip


def sweep_fit_dict(fit: SweepFit) -> dict[str, Any]:
    """The whole fit: its trials, each registered law's keys (laws/), the gains, cells,
    backtest, advice and notes."""
    out = {
        "sweep": fit.sweep,
        "baseline": fit.baseline,
        "loss": fit.loss,
        "level": fit.level,
        "n_trials": fit.n_trials,
        "n_used": fit.n_used,
        "variants": fit.variants,
        "huber_delta": fit.huber_delta,
        "where": fit.where,
        **{key: value for law in laws.registered() for key, value in law.to_json(fit).items()},
        "gains": [
            {
                "variant": g.variant,
                "baseline": g.baseline,
                "estimator": "unpaired: compute-shifted law through both variants' trials",
                "multiplier": interval(g.multiplier),
                "reference_loss": num(g.reference_loss),
                "reference_flops": num(g.reference_flops),
                "shared_E": g.shared_E,
                "form": g.fit.baseline.form,
                "fallback": g.fit.baseline.fallback,
                "resamples_ok": g.n_resamples - g.n_failed,
                "text": str(g),
            }
            for g in fit.gains
        ],
        "paired_gains": [
            {
                "variant": p.variant,
                "baseline": p.baseline,
                "estimator": "paired: trials with the same cell and seed",
                "multiplier": interval(p.multiplier),
                "loss_ratio": interval(p.loss_ratio),
                "n_pairs": p.n_pairs,
                "n_cells": p.n_cells,
                "sigma": num(p.sigma),
                "se_pairs": num(p.se_pairs),
                "se_law": num(p.se_law),
                "text": str(p),
            }
            for p in fit.paired
        ],
        "axes": list(fit.axes),
        "cells": [
            {
                "cell": {k: num(v) for k, v in c.cell},
                "variant": c.variant,
                "loss": num(c.loss),
                "baseline_loss": num(c.baseline_loss),
                "loss_diff": num(c.loss_diff),
                "loss_diff_se": num(c.loss_diff_se),
                "n_pairs": c.n_pairs,
                "params_ratio": num(c.params_ratio),
                "flops_ratio": num(c.flops_ratio),
                "n_trials": c.n_trials,
                "baseline_n_trials": c.baseline_n_trials,
            }
            for c in fit.cells
        ],
        "backtest": fit.backtest.to_dict() if fit.backtest is not None else None,
        "advice": [advice_dict(a) for a in fit.advice],
        "notes": fit.notes,
    }
    return {key: out[key] for key in FIRST_KEYS if key in out} | out


def advice_dict(a: Any) -> dict[str, Any]:
    def projection(p: Any) -> dict[str, Any]:
        o = p.option
        return {
            "option": o.label,
            "n_trials": o.n_trials,
            "flops": num(o.cost_flops),
            "half_width": num(p.half_width),
            "power": num(p.power),
            "meets_target": p.meets_target,
        }

    return {
        "variant": a.variant,
        "baseline": a.baseline,
        "effect": a.effect,
        "level": a.level,
        "power": a.power,
        "current": projection(a.current),
        "best": projection(a.best) if a.best is not None else None,
        "options": [projection(p) for p in a.projections],
        # the measured gain: told from none already, or the cheapest option that would
        "measured_multiplier": num(a.multiplier),
        "measured_resolved": a.resolved,
        "for_measured": projection(a.for_measured) if a.for_measured is not None else None,
        "text": str(a),
    }
