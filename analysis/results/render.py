"""A SweepFit as rows of text: one source for the rich tables and the Markdown report."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from . import laws

if TYPE_CHECKING:
    from rich.table import Table

    from scalelab.analysis.scaling import CellComparison, Interval

    from .fit import SweepFit

Rows = tuple[list[str], list[list[str]]]  # (header, rows)


def _x(value: float) -> str:
    return f"{value:.2f}×" if np.isfinite(value) else "never"


def _g(value: float, digits: int = 4) -> str:
    return f"{value:.{digits}g}" if np.isfinite(value) else str(value)


def reading(m: Interval) -> str:
    if not np.isfinite(m.estimate):
        return "never reaches it on its fitted law"
    if m.high < 1:
        return "cheaper (CI < 1)"
    if m.low > 1:
        return "costlier (CI > 1)"
    return "no clear difference (CI spans 1)"


def _ci(m: Interval) -> str:
    return f"[{_x(m.low)}, {_x(m.high)}]"


def _unpaired_missing(fit: SweepFit, variant: str) -> str:
    """The unpaired cell of a variant without an unpaired gain: why, when a note says."""
    failed = any(n.startswith(f"unpaired gain of {variant} ") for n in fit.notes)
    return "none (see note)" if failed else ""


def gains_rows(fit: SweepFit) -> Rows:
    """Both estimators side by side; the reading is the paired one's when there is one."""
    level = fit.level
    head = [
        "variant",
        "paired FLOPs ×",
        f"{level:.0%} CI",
        "pairs",
        "loss Δ (paired)",
        "unpaired FLOPs ×",
        f"{level:.0%} CI ",
        "reading",
    ]
    rows = []
    for v in fit.variants:
        p = fit.paired_gain(v)
        g = next((g for g in fit.gains if g.variant == v), None)
        if p is None and g is None:
            continue
        if p is not None:
            r = p.loss_ratio
            paired = [_x(p.multiplier.estimate), _ci(p.multiplier), str(p.n_pairs),
                      f"{r.estimate - 1:+.2%} [{r.low - 1:+.2%}, {r.high - 1:+.2%}]"]  # fmt: skip
        else:
            paired = ["", "", "", ""]
        unpaired = (
            [_x(g.multiplier.estimate), _ci(g.multiplier)]
            if g is not None
            else [_unpaired_missing(fit, v), ""]
        )
        read = reading(p.multiplier if p is not None else g.multiplier)  # type: ignore[union-attr]
        if g is not None and g.fit.baseline.fallback:
            unpaired[0] += " (no E)"
        rows.append([v] + paired + unpaired + [read])
    return head, rows


def backtest_rows(fit: SweepFit) -> Rows:
    b = fit.backtest
    if b is None:
        return [], []
    level = b.predictions[0].level
    head = ["held-out run", "predicted", f"{level:.0%} prediction interval", "actual", "covered"]
    rows = [
        [t.label, f"{p.loss:.4g}",
         f"[{p.low:.4g}, {p.high:.4g}]" + ("" if b.useful(p) else ": no useful forecast"),
         f"{t.actual:.4g}", "yes" if t.actual in p else "NO"]
        for t, p in zip(b.targets, b.predictions, strict=True)
    ]  # fmt: skip
    return head, rows


def advice_rows(fit: SweepFit) -> Rows:
    """Per variant: its measured gain (told from none, or the smallest addition that would
    tell it), then the target effect's advice (the section's title names the target)."""
    head = ["variant", "measured gain", "to tell it from none", "now: CI half-width",
            "power now", "to tell the target gain from none", "cost"]  # fmt: skip
    rows = []
    for a in fit.advice:
        best, told = a.best, a.for_measured
        rows.append(
            [
                a.variant,
                a.measured,
                "already told (CI excludes 1)" if a.resolved
                else (f"add {told.option.label} ({told.option.n_trials} trials)" if told
                      else "no option tried suffices"),
                f"±{np.expm1(a.current.half_width):.1%}",
                f"{a.current.power:.0%}",
                "already resolved" if a.current.meets_target
                else (f"add {best.option.label}" if best else "no option tried suffices"),
                f"{best.option.n_trials} trials, {best.option.cost_flops:.3g} FLOPs" if best and
                not a.current.meets_target else "",
            ]
        )  # fmt: skip
    return head, rows


def cells_rows(fit: SweepFit) -> Rows:
    """Each variant against the baseline per cell (every swept axis), means over seeds."""
    return comparison_rows(fit.cells, fit.axes, fit.baseline, "loss")


def comparison_rows(
    cells: list[CellComparison], axes: list[str], baseline: str, measure: str
) -> Rows:
    """Per-cell comparisons of `measure` (the loss, or any column: `results compare`)."""
    from .design import axis_label

    head = [axis_label(a) for a in axes] + [
        "variant",
        measure,
        f"{baseline} {measure}",
        f"Δ {measure}",
        "params ×",
        "FLOPs ×",
        "seeds",
    ]

    def order(c: CellComparison) -> tuple:
        values = [(0, v) if isinstance(v, (int, float)) else (1, str(v)) for _, v in c.cell]
        return (c.baseline_n_params, values, c.variant)

    rows = []
    for c in sorted(cells, key=order):
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
    return [(title, rows) for title, rows, _ in _sections(fit)]


def markdown_sections(fit: SweepFit) -> list[str]:
    """The report's tables: each section's title and Markdown table, and after a law's
    tables the Markdown it adds (Law.report_lines)."""
    md = []
    for title, (head, rows), extra in _sections(fit):
        md += ["", f"## {title}", "", markdown_table(head, rows)]
        md += ["", *extra] if extra else []
    return md


def _sections(fit: SweepFit) -> list[tuple[str, Rows, list[str]]]:
    """(title, rows, the report's Markdown after it) of every non-empty table: the gains
    and advice, then each registered law's tables (laws/), the backtest, per cell."""
    effect = fit.advice[0].effect if fit.advice else 0.05
    before = [
        (
            f"Compute-equivalent gain vs {fit.baseline}: paired (same cell and seed) and "
            "unpaired (laws through each variant's trials)",
            gains_rows(fit),
        ),
        (
            f"What to run next: to tell the measured gain, and a target gain as small as "
            f"{effect:.0%} (--effect), from none at {fit.level:.0%} (80% power), paired "
            "estimator",
            advice_rows(fit),
        ),
    ]  # fmt: skip
    after = [
        (
            f"Forecast backtest: {fit.backtest.variant} on held-out {fit.backtest.holdout} "
            f"from {fit.backtest.fitted_on} ({fit.backtest.law.name}, "
            f"{fit.backtest.law.law.form})"
            if fit.backtest else "Forecast backtest",
            backtest_rows(fit),
        ),
        (
            f"Per cell vs {fit.baseline} (every swept axis; means over seeds only, "
            "Δ ± its standard error over seeds)",
            cells_rows(fit),
        ),
    ]  # fmt: skip
    out = [(title, rows, []) for title, rows in before]
    for law in laws.registered():
        shown = [(title, rows, []) for title, rows in law.sections(fit) if rows[1]]
        if shown:
            shown[-1][2].extend(law.report_lines(fit))
        out += shown
    out += [(title, rows, []) for title, rows in after]
    return [(title, rows, extra) for title, rows, extra in out if rows[1]]


def rich_tables(fit: SweepFit) -> list[Table]:
    return [rich_table(title, rows) for title, rows in sections(fit)]


def rich_table(title: str, rows: Rows) -> Table:
    from rich.table import Table

    head, body = rows
    table = Table(title=title, title_justify="left")
    for i, h in enumerate(head):
        table.add_column(
            h,
            justify="left"
            if i == 0 or h in ("variant", "size", "reading", "check", "law (frontier)")
            else "right",
        )
    for r in body:
        table.add_row(*r)
    return table


def markdown_table(head: list[str], rows: list[list[str]]) -> str:
    def esc(s: str) -> str:
        return s.replace("|", "\\|")

    lines = [
        "| " + " | ".join(esc(h) for h in head) + " |",
        "|" + "|".join("---" for _ in head) + "|",
    ]
    lines += ["| " + " | ".join(esc(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)
