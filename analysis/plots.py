"""Pictures of a sweep's results (matplotlib, Agg): only those the data supports.

loss_vs_flops   every trial's val/loss curve against training FLOPs, coloured by variant,
                with each variant's L(C) fitted on its frontier (saying when it fell back
                to the law without E; a failed fit check said once, in the title, with
                the failing laws marked † when not all failed) and the Pareto frontier
loss_vs_params  final loss against parameters, per variant, its best per size label
isoflop         loss against N at each compute budget, with the fitted parabolas
gains           compute-equivalent gain of each variant by both estimators, with intervals
and one figure per plot a registered mechanism declares (models/catalog.py: BudgetFormer's
budget_s_mean, TSA's tsa_alpha, ...), drawn by `metric_figure`: every point is a cell's mean
over its seeds, never over budgets
eval_<task>_<metric>_vs_flops   a downstream score against FLOPs, joined in FLOPs order
                per variant and budget, with the task's chance level

Long titles wrap to the figure's width; log axes are labelled at powers of ten, slanted.

`make_plots` writes PNGs to results/<sweep>/plots; `log_plots` attaches them to the
sweep's parent MLflow run (artifact folder `plots/`).

Why one module: one function per figure, sharing the axes, colours and labels that make the
figures read alike.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import pyarrow as pa
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from scalelab.analysis.results.fit import SweepFit
    from scalelab.models.mechanism import MetricPlot

DPI = 120


def fit_title(ax: Axes, text: str) -> None:
    """Set a title that fits the figure's width: wrapped at words onto more lines (an
    average glyph is about 0.6 of the font size wide), never clipped at either side."""
    import textwrap

    title = ax.set_title(text)
    size = title.get_fontsize()  # points
    width_pt = ax.figure.get_figwidth() * 72
    chars = max(int(width_pt / (0.6 * size)) - 4, 20)
    title.set_text("\n".join(textwrap.wrap(text, chars, break_on_hyphens=False)))


def log_x_axis(ax: Axes) -> None:
    """A log x axis (FLOPs, parameters, tokens) labelled at powers of ten (1, 2 and 5
    times them when the data span under two decades), at most 6 labels, slanted so that
    neighbours never overlap; minor ticks unlabelled."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.set_xscale("log")
    x = np.concatenate([np.asarray(line.get_xdata(), float) for line in ax.get_lines()] or [[]])
    subs = (1.0,) if spans_decades(x, 2.0) else (1.0, 2.0, 5.0)
    ax.xaxis.set_major_locator(LogLocator(base=10, subs=subs, numticks=6))
    ax.xaxis.set_major_formatter(FuncFormatter(_power_of_ten))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.tick_params(axis="x", which="major", labelrotation=30)


def _power_of_ten(value: float, _pos: object = None) -> str:
    """2e13 as 2×10¹³ (mathtext), 1e13 as 10¹³."""
    if not (np.isfinite(value) and value > 0):
        return ""
    exponent = int(np.floor(np.log10(value) + 1e-9))
    mantissa = round(value / 10.0**exponent, 2)
    head = "" if mantissa == 1 else f"{mantissa:g}\\times"
    return f"${head}10^{{{exponent}}}$"


def new_figure(width: float = 7.0, height: float = 4.6) -> tuple[Figure, Any]:
    from matplotlib.figure import Figure  # no pyplot: no global state, no GUI backend

    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    return fig, fig.add_subplot()


def colours(variants: list[str]) -> dict[str, Any]:
    import matplotlib

    cmap = matplotlib.colormaps["tab10"]
    return {v: cmap(i % 10) for i, v in enumerate(variants)}


def spans_decades(x: np.ndarray, decades: float = 1.0) -> bool:
    x = x[np.isfinite(x) & (x > 0)]
    return x.size > 1 and np.log10(x.max() / x.min()) >= decades


def _col(table: pa.Table, name: str) -> np.ndarray:
    return table[name].to_numpy(zero_copy_only=False).astype(float)


def loss_vs_flops(fit: SweepFit, curves: pa.Table | None, metric: str = "val/loss") -> Figure:
    import pyarrow as pa
    import pyarrow.compute as pc

    from scalelab.analysis.scaling import pareto_frontier

    fig, ax = new_figure()
    col = colours(fit.variants)
    t = fit.table
    variant_of = dict(zip(t["trial_id"].to_pylist(), t["variant"].to_pylist(), strict=True))
    if curves is not None and curves.num_rows:
        sel = curves.filter(pc.equal(curves["metric"], metric))
        tid = sel["trial_id"].cast(pa.string()).to_numpy(zero_copy_only=False)
        x, y = _col(sel, "flops"), _col(sel, "value")
        for trial in np.unique(tid):
            v = variant_of.get(trial)
            if v is None:
                continue
            rows = (tid == trial) & (x > 0) & np.isfinite(y)
            ax.plot(x[rows], y[rows], color=col[v], alpha=0.35, lw=0.9)
    c, y = _col(t, "flops"), _col(t, fit.loss)
    variants = t["variant"].to_pylist()
    for v in fit.variants:
        rows = np.array([u == v for u in variants])
        ax.scatter(c[rows], y[rows], color=col[v], s=18, zorder=3, label=f"{v} (final)")
        if v in fit.laws:
            law = fit.laws[v]
            grid = np.geomspace(c[rows].min(), c[rows].max(), 100)
            ax.plot(grid, law.predict(grid), "--", color=col[v], lw=1.6, label=law_label(fit, v))
    front = pareto_frontier(c, y)
    ax.plot(c[front], y[front], "-", color="black", lw=1.0, alpha=0.7, label="Pareto frontier")
    ax.set_xscale("log")
    if spans_decades(y, 1.0):
        ax.set_yscale("log")
    ax.set_xlabel("training compute C (FLOPs)")
    ax.set_ylabel(f"{metric} (nats/token)")
    failed = [v for v in fit.laws if fit.law_checks[v].failed]
    title = f"{fit.sweep}: loss vs compute"
    if failed:
        which = "every law" if len(failed) == len(fit.laws) else "†: the law"
        title += f" ({which} failed a fit check: read it with care, see the report)"
    fit_title(ax, title)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=7, loc="upper right")
    return fig


def law_label(fit: SweepFit, variant: str) -> str:
    """'dense: L = 2.53 + 2.6e+10·C^-0.988 (frontier)', saying when the law fell back to
    one without E; a law that failed a check ends in ' †' when only some did (the title
    says which: all of them, or those marked)."""
    law, check = fit.laws[variant], fit.law_checks[variant]
    k = law.values()
    text = f"{variant}: L = "
    text += f"{k['E']:.3g} + " if law.has_E else ""
    text += f"{k['A']:.3g}·C^-{k['alpha']:.3f} (frontier"
    if law.fallback:
        text += "; no E: fallback"
    text += ")"
    some_failed = sum(fit.law_checks[v].failed for v in fit.laws) < len(fit.laws)
    return text + " †" if check.failed and some_failed else text


def loss_vs_params(fit: SweepFit) -> Figure:
    fig, ax = new_figure()
    col = colours(fit.variants)
    t = fit.table
    n, y = _col(t, "n_params"), _col(t, fit.loss)
    variants = np.array(t["variant"].to_pylist())
    sizes = np.array([str(s) if s is not None else f"N={k:g}"
                      for s, k in zip(t["size"].to_pylist(), n, strict=True)])  # fmt: skip
    for v in fit.variants:
        rows = variants == v
        ax.scatter(n[rows], y[rows], color=col[v], s=16, alpha=0.6)
        ax.plot(*best_per_size(n[rows], y[rows], sizes[rows]), "-o", color=col[v], ms=4,
                label=f"{v} (best per size)")  # fmt: skip
    _loss_vs_params_axes(ax, fit, "final loss vs model size", legend_size=8)
    return fig


def best_per_size(n: np.ndarray, y: np.ndarray, sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One point per size label, in order of N: its trials' median N and lowest loss (an
    imported ladder's N differ in the 8th figure within one size: never a point per run)."""
    points = sorted((float(np.median(n[sizes == s])), float(y[sizes == s].min()))
                    for s in np.unique(sizes))  # fmt: skip
    return np.array([p[0] for p in points]), np.array([p[1] for p in points])


def isoflop(fit: SweepFit) -> Figure:
    import matplotlib

    fig, ax = new_figure()
    t = fit.table
    n, y, b = _col(t, "n_params"), _col(t, fit.loss), _col(t, "budget_flops")
    variants = np.array(t["variant"].to_pylist())
    styles = ["-", "--", ":", "-."]
    budgets = np.unique(b[np.isfinite(b)])
    cmap = matplotlib.colormaps["viridis"]
    for k, (v, iso) in enumerate(fit.isoflop.items()):
        for j, opt in enumerate(iso.budgets):
            colour = cmap(j / max(len(budgets) - 1, 1))
            rows = (variants == v) & (b == opt.flops)
            ax.scatter(n[rows], y[rows], color=colour, s=16)
            log_n = np.log(n[rows])
            c2, c1, c0 = np.polyfit(log_n, y[rows], 2)
            grid = np.linspace(log_n.min(), log_n.max(), 60)
            label = (
                f"{v}, C = {opt.flops:.1e}"
                if len(fit.isoflop) > 1
                else f"C = {opt.flops:.1e} FLOPs"
            )
            ax.plot(
                np.exp(grid),
                c2 * grid**2 + c1 * grid + c0,
                styles[k % 4],
                color=colour,
                label=label,
            )
            ax.plot([opt.n_opt], [opt.loss_opt], "*", color=colour, ms=10, mec="black")
    _loss_vs_params_axes(ax, fit, "IsoFLOP profiles (★ = optimum N*)", legend_size=7)
    return fig


def _loss_vs_params_axes(ax: Axes, fit: SweepFit, title: str, legend_size: int) -> None:
    """Parameters N on a log x-axis, the fitted loss on y, a light grid and the legend."""
    ax.set_xscale("log")
    ax.set_xlabel("parameters N")
    ax.set_ylabel(f"{fit.loss} (nats/token)")
    fit_title(ax, f"{fit.sweep}: {title}")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=legend_size)


def gains(fit: SweepFit) -> Figure:
    """Each variant's gain by both estimators: paired (filled) and unpaired (open)."""
    shown = [v for v in fit.variants if _gain_pair(fit, v) != (None, None)]
    fig, ax = new_figure(6.5, 1.4 + 0.7 * len(shown))
    col = colours(fit.variants)
    for i, v in enumerate(shown):
        for offset, (kind, interval) in zip((0.15, -0.15), _gain_pair_named(fit, v), strict=True):
            if interval is None or not np.isfinite(interval.estimate):
                continue
            m = interval
            high = m.high if np.isfinite(m.high) else m.estimate * 10
            ax.errorbar(m.estimate, i + offset, xerr=[[m.estimate - m.low], [high - m.estimate]],
                        fmt="o", color=col[v], mfc=col[v] if kind == "paired" else "white",
                        capsize=4, ms=6, label=kind if i == 0 else None)  # fmt: skip
            ax.annotate(f"{kind} {m.estimate:.2f}× [{m.low:.2f}, {m.high:.2f}]",
                        (m.estimate, i + offset), textcoords="offset points", xytext=(0, 6),
                        ha="center", fontsize=7)  # fmt: skip
    ax.axvline(1.0, color="grey", ls="--", lw=1, label=f"{fit.baseline} (1×)")
    ax.set_yticks(np.arange(len(shown)), shown)
    ax.set_ylim(-0.7, len(shown) - 0.3)
    ax.set_xscale("log")
    from matplotlib.ticker import FuncFormatter

    times = FuncFormatter(lambda v, _: f"{v:.2g}×")
    ax.xaxis.set_major_formatter(times)
    ax.xaxis.set_minor_formatter(times)
    ax.tick_params(axis="x", which="minor", labelsize=7)
    ax.set_xlabel(f"FLOPs to reach the {fit.baseline} loss, × {fit.baseline}'s (< 1: cheaper)")
    fit_title(ax, f"{fit.sweep}: compute-equivalent gain ({fit.level:.0%} CI), paired and unpaired")
    ax.grid(True, axis="x", which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    return fig


def _gain_pair(fit: SweepFit, variant: str) -> tuple[Any, Any]:
    p = fit.paired_gain(variant)
    g = next((g for g in fit.gains if g.variant == variant), None)
    return (
        p.multiplier if p is not None else None,
        g.multiplier if g is not None else None,
    )


def _gain_pair_named(fit: SweepFit, variant: str) -> list[tuple[str, Any]]:
    paired, unpaired = _gain_pair(fit, variant)
    return [("paired", paired), ("unpaired", unpaired)]


# Axis labels of the backbone's columns; a mechanism's come from its Column declarations.
LABELS = {"n_params": "parameters N", "n_nonembed": "non-embedding parameters",
          "flops": "training FLOPs C", "tokens": "training tokens D"}  # fmt: skip
LOG_AXES = frozenset(LABELS)


def metric_figure(table: pa.Table, plot: MetricPlot) -> Figure | None:
    """A mechanism's figure (models.mechanism.MetricPlot): `plot.y` against the first of
    `plot.x` that takes more than one value (else the last), one line per `plot.series`
    value and token budget (never averaged across budgets); each point is a cell's mean
    over its seeds. When every such line would be one point, one line per budget instead.
    None when no trial has a value."""
    import matplotlib

    if plot.y not in table.column_names:
        return None
    y_all = _col(table, plot.y)
    rows = np.isfinite(y_all)
    if not rows.any():
        return None
    varied = [x for x in plot.x if x in table.column_names
              and np.unique(_col(table, x)[rows & np.isfinite(_col(table, x))]).size > 1]  # fmt: skip
    x_name = varied[0] if varied else plot.x[-1]
    x, y = _col(table, x_name)[rows], y_all[rows]
    series = np.array([str(v) for v in table[plot.series].to_pylist()])[rows]
    budgets = _budget_labels(table)[rows]
    lines = {(s, b): (series == s) & (budgets == b) for s in set(series) for b in set(budgets)}
    lines = {k: r for k, r in lines.items() if r.any()}
    if all(np.unique(x[r]).size <= 1 for r in lines.values()):
        lines = {("", b): budgets == b for b in set(budgets)}
    n = _col(table, "n_params")[rows]
    order = sorted({s for s, _ in lines}, key=lambda s: (n[series == s].min() if s else 0, s))
    cmap = matplotlib.colormaps["plasma"]
    styles = ["o-", "s--", "^:", "d-."]
    budget_order = sorted({b for _, b in lines}, key=_budget_order)
    fig, ax = new_figure(6.0, 4.0)
    for (s, b), r in sorted(
        lines.items(), key=lambda kv: (order.index(kv[0][0]), _budget_order(kv[0][1]))
    ):
        label = ", ".join(p for p in (s, b) if p) or None
        colour = cmap(order.index(s) / max(len(order), 1))
        ax.plot(*_sorted(x[r], y[r]), styles[budget_order.index(b) % 4], color=colour, label=label)
    if x_name in LOG_AXES:
        log_x_axis(ax)
    if plot.ylim is not None:
        ax.set_ylim(*plot.ylim)
    ax.set_xlabel(_label(x_name))
    ax.set_ylabel(_label(plot.y))
    fit_title(ax, f"{plot.title or plot.y} (each point: mean over seeds)")
    ax.grid(True, alpha=0.3)
    if any(line.get_label() and not line.get_label().startswith("_") for line in ax.get_lines()):
        ax.legend(fontsize=8)
    return fig


def downstream_vs_flops(table: pa.Table, column: str) -> Figure | None:
    """A downstream score (`eval_<task>_<metric>`) against training FLOPs: each point a
    cell's mean over seeds (every swept axis but the seed) with its standard error where
    there are several, joined in increasing FLOPs per variant and budget (the swept axes
    other than the size: cells of different budgets are never joined; a ladder, whose
    tokens grow with the size, is one line per variant), the task's chance
    level as a dotted line where it is known. None when no trial has the score."""
    from scalelab.analysis.results.design import read_design

    if column not in table.column_names:
        return None
    y_all = _col(table, column)
    if not np.isfinite(y_all).any():
        return None
    design = read_design(table)
    cells = [tuple(design.table[a].to_pylist()) for a in design.axes]
    variants = [str(v) for v in table["variant"].to_pylist()]
    budgets = _budget_labels(table)
    flops = _col(table, "flops")
    points: dict[tuple[str, str], dict[tuple, list[int]]] = {}
    for i, (v, y) in enumerate(zip(variants, y_all, strict=True)):
        if np.isfinite(y):
            line = points.setdefault((v, str(budgets[i])), {})
            line.setdefault(tuple(c[i] for c in cells), []).append(i)
    if all(len(line) <= 1 for line in points.values()):  # a ladder: tokens grow with size
        merged: dict[tuple[str, str], dict[tuple, list[int]]] = {}
        for (v, _), line in points.items():
            merged.setdefault((v, ""), {}).update(line)
        points = merged
    fig, ax = new_figure(6.0, 4.0)
    palette = colours(sorted({v for v, _ in points}))
    styles = ["o-", "s--", "^:", "d-."]
    budget_order = sorted({b for _, b in points}, key=_budget_order)
    for v, b in sorted(points, key=lambda k: (k[0], _budget_order(k[1]))):
        rows = sorted(points[v, b].values(), key=lambda r: flops[r].mean())
        x = np.array([flops[r].mean() for r in rows])
        y = np.array([y_all[r].mean() for r in rows])
        se = np.array([y_all[r].std(ddof=1) / np.sqrt(len(r)) if len(r) > 1 else 0.0 for r in rows])
        label = ", ".join(p for p in (v, b) if p)
        fmt = styles[budget_order.index(b) % len(styles)]
        ax.errorbar(x, y, yerr=se, fmt=fmt, color=palette[v], label=label, capsize=3)
    chance = task_chance(column)
    if chance is not None and chance > 0:
        ax.axhline(chance, color="grey", ls=":", lw=1.2, label=f"chance ({chance:g})")
    log_x_axis(ax)
    ax.set_xlabel(LABELS["flops"])
    ax.set_ylabel(column)
    fit_title(ax, f"{column} (each point: a cell's mean over seeds ± se)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def task_chance(column: str) -> float | None:
    """The chance accuracy of the task of `eval_<task>_<metric>` (1 / choices; from
    analysis/scaling/task_laws.py's table), None for a task it does not know."""
    from scalelab.analysis.scaling.task_laws import CHANCE

    name = column.removeprefix("eval_")
    for metric in ("_acc_norm", "_acc"):
        if name.endswith(metric):
            return CHANCE.get(name.removesuffix(metric))
    return None


def _label(column: str) -> str:
    from scalelab.models import catalog

    declared = {c.name: c.label for _, c in catalog.columns() if c.label}
    return declared.get(column) or LABELS.get(column, column)


def _budget_labels(table: pa.Table) -> np.ndarray:
    """Per trial, its cell's swept axes other than the size, in words ('tokens=98304'):
    the lines of the mechanism plots (one per budget, never averaged across budgets)."""
    from scalelab.analysis.results.design import axis_label, read_design

    design = read_design(table)
    axes = [a for a in design.axes if a != "size"]
    if not axes:
        return np.array([""] * table.num_rows)
    values = [design.table[a].to_pylist() for a in axes]
    return np.array(
        [", ".join(f"{axis_label(a)}={v[i]}" for a, v in zip(axes, values, strict=True))
         for i in range(table.num_rows)]
    )  # fmt: skip


def _budget_order(label: str) -> list:
    """Numeric parts of a label in order ('tokens=32768' before 'tokens=98304')."""
    import re

    return [float(x) for x in re.findall(r"[-+]?\d*\.?\d+(?:[eE][-+]?\d+)?", label)]


def _sorted(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean y per distinct x, in x order."""
    xs = np.unique(x)
    return xs, np.array([y[x == v].mean() for v in xs])


def figures(fit: SweepFit, curves: pa.Table | None) -> dict[str, Figure]:
    """The figures this sweep's data supports, by name."""
    out = {"loss_vs_flops": loss_vs_flops(fit, curves), "loss_vs_params": loss_vs_params(fit)}
    if fit.isoflop:
        out["isoflop"] = isoflop(fit)
    if fit.gains or fit.paired:
        out["gains"] = gains(fit)
    from scalelab.models import catalog

    for plot in catalog.plots():
        figure = metric_figure(fit.table, plot)
        if figure is not None:
            out[plot.name] = figure
    scores = [c for c in fit.table.column_names
              if c.startswith("eval_") and c.endswith(("_acc", "_acc_norm"))]  # fmt: skip
    for column in scores:
        figure = downstream_vs_flops(fit.table, column)
        if figure is not None:
            out[f"{column}_vs_flops"] = figure
    return out


def make_plots(fit: SweepFit, curves: pa.Table | None, out_dir: Path) -> dict[str, Path]:
    """Write every supported figure as out_dir/<name>.png; return the paths by name."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in out_dir.glob("*.png"):
        old.unlink()  # a plot the data no longer supports must not linger
    written = {}
    for name, fig in figures(fit, curves).items():
        path = out_dir / f"{name}.png"
        fig.savefig(path)
        written[name] = path
    return written


def log_plots(parent_run_id: str | None, files: dict[str, Path], tracking_uri: str) -> bool:
    """Attach the PNGs to the sweep's parent run (artifact folder plots/). False when the
    sweep has no parent run."""
    if parent_run_id is None or not files:
        return False
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri)
    for path in files.values():
        client.log_artifact(parent_run_id, str(path), artifact_path="plots")
    return True
