"""A SweepFit as rows of text: one source for the rich tables and the Markdown report."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from rich.table import Table

    from orchestrator.scaling import CellComparison

    from .fit import SweepFit

Rows = tuple[list[str], list[list[str]]]  # (header, rows)


def _x(value: float) -> str:
    return f"{value:.2f}×" if np.isfinite(value) else "never"


def _g(value: float, digits: int = 4) -> str:
    return f"{value:.{digits}g}" if np.isfinite(value) else str(value)


def gains_rows(fit: SweepFit) -> Rows:
    level = fit.gains[0].multiplier.level if fit.gains else fit.level
    head = [
        "variant",
        f"FLOPs × {fit.baseline}",
        f"{level:.0%} CI",
        "reference loss",
        f"{fit.baseline} FLOPs there",
        "reading",
    ]
    rows = []
    for g in fit.gains:
        m = g.multiplier
        if not np.isfinite(m.estimate):
            reading = "never reaches it on its fitted law"
        elif m.high < 1:
            reading = "cheaper (CI below 1)"
        elif m.low > 1:
            reading = "costlier (CI above 1)"
        else:
            reading = "no clear difference (CI spans 1)"
        rows.append(
            [
                g.variant,
                _x(m.estimate),
                f"[{_x(m.low)}, {_x(m.high)}]",
                _g(g.reference_loss),
                f"{g.reference_flops:.3g}",
                reading,
            ]
        )
    return head, rows


def laws_rows(fit: SweepFit) -> Rows:
    head = ["variant", "E", "A", "alpha", "trials", "frontier trials"]
    rows = []
    for v, b in fit.laws.items():
        rows.append(
            [
                v,
                str(b["E"]),
                str(b["A"]),
                str(b["alpha"]),
                str(b.point.n_trials),
                str(len(fit.frontier.get(v, []))),
            ]
        )
    return head, rows


def chinchilla_rows(fit: SweepFit) -> Rows:
    head = ["variant", "E", "A", "B", "alpha", "beta", "N* ∝ C^a"]
    rows = [
        [v, str(b["E"]), str(b["A"]), str(b["B"]), str(b["alpha"]), str(b["beta"]), str(b["a"])]
        for v, b in fit.chinchilla.items()
    ]
    return head, rows


def isoflop_rows(fit: SweepFit) -> Rows:
    head = [
        "variant",
        "budget C (FLOPs)",
        "N_opt",
        "D_opt (tokens)",
        "loss at optimum",
        "inside sampled N",
    ]
    rows = []
    for v, iso in fit.isoflop.items():
        for o in iso.budgets:
            rows.append(
                [
                    v,
                    f"{o.flops:.3g}",
                    f"{o.n_opt:.3g}",
                    f"{o.d_opt:.3g}",
                    _g(o.loss_opt),
                    "yes" if o.interior else "no (extrapolated)",
                ]
            )
        rows.append([v, "N_opt ∝ C^a", f"a = {iso.a:.3f}", f"b = {iso.b:.3f}", "", ""])
    return head, rows


def cells_rows(fit: SweepFit) -> Rows:
    """Each variant against the baseline per cell (every swept axis), means over seeds."""
    from .design import axis_label

    axes = [a for a in fit.axes]
    head = [axis_label(a) for a in axes] + [
        "variant",
        "loss",
        f"{fit.baseline} loss",
        "Δ loss",
        "params ×",
        "FLOPs ×",
        "seeds",
    ]

    def order(c: CellComparison) -> tuple:
        values = [(0, v) if isinstance(v, (int, float)) else (1, str(v)) for _, v in c.cell]
        return (c.baseline_n_params, values, c.variant)

    rows = []
    for c in sorted(fit.cells, key=order):
        values = dict(c.cell)
        diff = f"{c.loss_diff:+.4f}"
        if np.isfinite(c.loss_diff_se):
            diff += f" ± {c.loss_diff_se:.4f}"
        rows.append(
            [_cell(values.get(a)) for a in axes]
            + [
                c.variant,
                _g(c.loss),
                _g(c.baseline_loss),
                diff,
                f"{c.params_ratio:.3f}",
                f"{c.flops_ratio:.3f}",
                f"{c.n_trials}/{c.baseline_n_trials}",
            ]
        )
    return head, rows


def _cell(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "" if value is None else str(value)


def sections(fit: SweepFit) -> list[tuple[str, Rows]]:
    """(title, rows) of every non-empty table, headline first."""
    out = [
        (f"Compute-equivalent gain vs {fit.baseline}", gains_rows(fit)),
        ("Loss vs compute: L(C) = E + A·C^-alpha (bootstrap CI)", laws_rows(fit)),
        ("Chinchilla: L(N, D) = E + A/N^alpha + B/D^beta", chinchilla_rows(fit)),
        ("IsoFLOP optima", isoflop_rows(fit)),
        (
            f"Per cell vs {fit.baseline} (every swept axis; means over seeds only, "
            "Δ ± its standard error over seeds)",
            cells_rows(fit),
        ),
    ]
    return [(title, rows) for title, rows in out if rows[1]]


def rich_tables(fit: SweepFit) -> list[Table]:
    from rich.table import Table

    tables = []
    for title, (head, rows) in sections(fit):
        table = Table(title=title, title_justify="left")
        for i, h in enumerate(head):
            table.add_column(
                h, justify="left" if i == 0 or h in ("variant", "size", "reading") else "right"
            )
        for r in rows:
            table.add_row(*r)
        tables.append(table)
    return tables


def markdown_table(head: list[str], rows: list[list[str]]) -> str:
    def esc(s: str) -> str:
        return s.replace("|", "\\|")

    lines = [
        "| " + " | ".join(esc(h) for h in head) + " |",
        "|" + "|".join("---" for _ in head) + "|",
    ]
    lines += ["| " + " | ".join(esc(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)
