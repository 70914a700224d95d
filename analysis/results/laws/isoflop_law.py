"""IsoFLOP profiles per variant (Hoffmann et al.'s Approach 2, analysis/scaling/isoflop.py):
a parabola in log N per compute budget, on the nominal budgets of an isoflop axis
(`budget_flops`), or with --isoflop-bin-width on the trials' real FLOPs binned; `results
fit`'s 'IsoFLOP optima' table and --json's `isoflop`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from .base import Law, LawFit, Skipped

if TYPE_CHECKING:
    from ..fit import SweepFit
    from ..render import Rows
    from .base import VariantTrials


class IsoFlop(Law):
    name = "isoflop"
    form = "N_opt = k_n·C^a, D_opt = k_d·C^b"
    params = ("a", "b", "k_n", "k_d")
    label = "IsoFLOP"
    title = "IsoFLOP optima"

    def applies(self, trials: VariantTrials) -> bool:
        """An isoflop axis, or budgets to bin the real FLOPs into."""
        binned = trials.options.isoflop_bin_width is not None
        return binned or "budget_flops" in trials.table.column_names

    def fit(self, trials: VariantTrials) -> LawFit | Skipped | None:
        """On the nominal budgets, or on the real FLOPs binned `isoflop_bin_width` decades
        wide (bins with fewer than 3 sizes are left out, and said)."""
        from scalelab.analysis.scaling import fit_isoflop
        from scalelab.analysis.scaling.isoflop import bin_budgets

        v, width = trials.variant, trials.options.isoflop_bin_width
        n, d, y = trials.column("n_params"), trials.column("tokens"), trials.losses
        if width is not None:
            budgets = bin_budgets(trials.column("flops"), width)
            keep = np.zeros(trials.table.num_rows, bool)
            for b in np.unique(budgets[np.isfinite(budgets)]):
                members = budgets == b
                keep |= members & (np.unique(n[members]).size >= 3)
            dropped = np.unique(budgets[~keep & np.isfinite(budgets)]).size
            if dropped:
                trials.note(
                    f"IsoFLOP of {v}: {dropped} FLOPs bin(s) {width:g} decades wide with "
                    "fewer than 3 sizes left out"
                )
            budgets, n, d, y = budgets[keep], n[keep], d[keep], y[keep]
        else:
            budgets = trials.column("budget_flops")
        if budgets.size and np.isfinite(budgets).all() and np.unique(budgets).size >= 2:
            iso = fit_isoflop(budgets, n, y, tokens=d)
            return LawFit(iso, n_trials=int(budgets.size))
        if width is not None:
            return Skipped("fewer than 2 FLOPs bins with 3 or more sizes")
        return None

    def constants(self, fitted: LawFit, level: float) -> Mapping[str, Any]:
        iso = fitted.result
        return {"a": iso.a, "b": iso.b, "k_n": iso.k_n, "k_d": iso.k_d}

    def sections(self, fit: SweepFit) -> list[tuple[str, Rows]]:
        head = ["variant", "budget C (FLOPs)", "N_opt", "D_opt (tokens)", "loss at optimum",
                "inside sampled N"]  # fmt: skip
        rows = []
        for v, r in self.results(fit).items():
            iso = r.result
            for o in iso.budgets:
                rows.append(
                    [
                        v,
                        f"{o.flops:.3g}",
                        f"{o.n_opt:.3g}",
                        f"{o.d_opt:.3g}",
                        f"{o.loss_opt:.4g}" if np.isfinite(o.loss_opt) else str(o.loss_opt),
                        "yes" if o.interior else "no (extrapolated)",
                    ]
                )
            rows.append([v, "N_opt ∝ C^a", f"a = {iso.a:.3f}", f"b = {iso.b:.3f}", "", ""])
        return [(self.title, (head, rows))]

    def to_json(self, fit: SweepFit) -> dict[str, Any]:
        from ..json_values import num

        return {
            "isoflop": {
                v: {
                    "a": f.a,
                    "b": f.b,
                    "k_n": f.k_n,
                    "k_d": f.k_d,
                    "budgets": [{k: num(x) for k, x in vars(o).items()} for o in f.budgets],
                }
                for v, r in self.results(fit).items()
                for f in [r.result]
            }
        }
