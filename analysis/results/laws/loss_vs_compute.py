"""L(C) = E + A C^-alpha per variant, by least squares through its compute frontier (t
intervals), with its check; `results fit`'s 'Loss vs compute' table and --json's
`power_law` and `frontier`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from .base import Law, LawFit

if TYPE_CHECKING:
    from scalelab.analysis.scaling import Interval

    from ..fit import SweepFit
    from ..render import Rows
    from .base import VariantTrials


class LossVsCompute(Law):
    name = "power_law"
    form = "E + A·C^-alpha"
    params = ("E", "A", "alpha")
    label = "L(C)"
    title = "Loss vs compute: L(C) through each variant's compute frontier (t intervals)"

    def fit(self, trials: VariantTrials) -> LawFit | None:
        """Through the variant's compute frontier (recorded in `fit.frontier`), or all its
        trials when the frontier has fewer than 3 (or one compute value)."""
        from scalelab.analysis.scaling import pareto_frontier
        from scalelab.analysis.scaling.checks import check_power_law
        from scalelab.analysis.scaling.lsq import lsq_power_law

        v, c, y, ids = trials.variant, trials.column("flops"), trials.losses, trials.ids
        front = trials.attempt(f"frontier of {v}", lambda: pareto_frontier(c, y))
        if front is None:
            return None
        trials.fit.frontier[v] = [ids[i] for i in front]
        if front.size < 3 or np.unique(c[front]).size < 2:
            trials.note(
                f"L(C) of {v}: its frontier has {front.size} trial(s), too few: fitted on all "
                f"{trials.table.num_rows} trials"
            )
            front = np.arange(trials.table.num_rows)
        law = lsq_power_law(c[front], y[front])
        check = check_power_law(law, c[front], y[front], labels=[ids[i] for i in front])
        return LawFit(law, n_trials=law.n, check=check)

    def constants(self, fitted: LawFit, level: float) -> Mapping[str, Interval]:
        return fitted.result.intervals(level)

    def sections(self, fit: SweepFit) -> list[tuple[str, Rows]]:
        head = ["variant", "law (frontier)", "E", "A", "alpha", "trials", "max |residual|",
                "check"]  # fmt: skip
        variants = fit.table["variant"].to_pylist()
        rows = []
        for v, r in self.results(fit).items():
            law, check = r.result, r.check
            i = law.intervals(fit.level)
            rows.append(
                [
                    v,
                    law.form,
                    str(i["E"]) if law.has_E else "—",
                    str(i["A"]),
                    str(i["alpha"]),
                    f"{law.n} of {variants.count(v)}",
                    f"{check.max_residual:.1%}",
                    check.summary(),
                ]
            )
        return [(self.title, (head, rows))]

    def to_json(self, fit: SweepFit) -> dict[str, Any]:
        from ..json_values import interval

        return {
            "power_law": {
                v: {
                    "form": r.result.form,
                    "fitted_on": "compute frontier",
                    "n_trials": r.result.n,
                    "constants": {k: interval(i) for k, i in r.result.intervals(fit.level).items()},
                    "check": r.check.to_dict(),
                }
                for v, r in self.results(fit).items()
            },
            "frontier": fit.frontier,
        }

    def predict(
        self, fitted: LawFit, *, n_params: np.ndarray, tokens: np.ndarray, flops: np.ndarray,
        level: float,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
        """The law's t prediction interval for one new run at compute C (lsq.py)."""
        return fitted.result.prediction_interval(flops, level=level)
