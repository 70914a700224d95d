"""Chinchilla's L(N, D) = E + A/N^alpha + B/D^beta per variant (the robust Huber fit with
bootstrap intervals, analysis/scaling/chinchilla.py) when the variant has 3 or more sizes
and token counts, with its check, and the compute-optimal allocation N*(C), D*(C) drawn
from it; `results fit`'s 'Chinchilla' and 'Compute-optimal allocation' tables and --json's
`chinchilla` and `allocation`."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from .base import Law, LawFit

if TYPE_CHECKING:
    from scalelab.analysis.scaling import Interval

    from ..fit import SweepFit
    from ..render import Rows
    from .base import FitOptions, VariantTrials


class Chinchilla(Law):
    name = "chinchilla"
    form = "E + A/N^alpha + B/D^beta"
    params = ("E", "A", "B", "alpha", "beta")
    label = "Chinchilla L(N, D)"
    short = "L(N, D)"
    title = "Chinchilla: L(N, D) = E + A/N^alpha + B/D^beta"
    refit_without_outliers = True

    def applies(self, trials: VariantTrials) -> bool:
        """3 or more sizes and token counts, 6 or more trials, and a fit that resamples."""
        n, d = trials.column("n_params"), trials.column("tokens")
        rich = np.unique(n).size >= 3 and np.unique(d).size >= 3 and trials.table.num_rows >= 6
        return trials.options.bootstrap is not None and rich

    def fit(self, trials: VariantTrials) -> LawFit:
        from scalelab.analysis.scaling.checks import check_chinchilla
        from scalelab.analysis.scaling.chinchilla import bootstrap_chinchilla

        n, d, y = trials.column("n_params"), trials.column("tokens"), trials.losses
        boot = bootstrap_chinchilla(n, d, y, delta=trials.options.huber_delta,
                                    **(trials.options.bootstrap or {}))  # fmt: skip
        check = check_chinchilla(boot.point, n, d, y, intervals=boot.intervals, labels=trials.ids)
        return LawFit(boot, boot.intervals, boot.point.n_trials, check)

    def after(self, fit: SweepFit, options: FitOptions, attempt: Callable[..., Any]) -> None:
        """The compute-optimal allocation at the budgets (default: the largest FLOPs of the
        trials, 10x and 100x it) from each variant's law."""
        if fit.chinchilla:
            from ..allocation import allocate, default_budgets

            chosen = tuple(options.budgets) if options.budgets else default_budgets(fit.table)
            for v, law in fit.chinchilla.items():
                found = attempt(f"allocation of {v}", lambda v=v, law=law: allocate(v, law, chosen))
                fit.allocation += found or []
        elif options.budgets:
            fit.notes.append(
                "allocation at --budget: needs Chinchilla's L(N, D) (3 or more sizes and token "
                "counts), which no variant has"
            )

    def constants(self, fitted: LawFit, level: float) -> Mapping[str, Interval]:
        return fitted.result.intervals

    def sections(self, fit: SweepFit) -> list[tuple[str, Rows]]:
        from ..allocation import allocation_rows

        head = ["variant", "law", "E", "A", "B", "alpha", "beta", "N* ∝ C^a", "check"]
        rows = [
            [v, b.point.form, str(b["E"]) if b.point.has_E else "—", str(b["A"]), str(b["B"]),
             str(b["alpha"]), str(b["beta"]), str(b["a"]), r.check.summary()]
            for v, r in self.results(fit).items()
            for b in [r.result]
        ]  # fmt: skip
        return [
            (self.title, (head, rows)),
            (
                f"Compute-optimal allocation from L(N, D) at C = 6ND ({fit.level:.0%} bootstrap "
                "intervals)",
                allocation_rows(fit.allocation),
            ),
        ]

    def to_json(self, fit: SweepFit) -> dict[str, Any]:
        from ..json_values import boot

        return {
            "chinchilla": {
                v: {**boot(r.result), "form": r.result.point.form, "check": r.check.to_dict()}
                for v, r in self.results(fit).items()
            },
            "allocation": [a.to_dict() for a in fit.allocation],
        }
