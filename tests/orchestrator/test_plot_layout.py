"""analysis.plots' layout: long titles wrap inside the figure, log FLOPs ticks never
overlap, a downstream score is joined in FLOPs order per variant and budget with the
task's chance level drawn, and a failed fit check is said once, not in every legend entry.
Figures from small synthetic tables; the checks read matplotlib's objects, not pixels."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from matplotlib.backends.backend_agg import FigureCanvasAgg

from scalelab.analysis import plots
from scalelab.models import catalog


def _drawn(fig):
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return canvas.get_renderer()


def _inside_figure(fig, artist) -> bool:
    box, frame = artist.get_window_extent(_drawn(fig)), fig.bbox
    return box.x0 >= frame.x0 - 0.5 and box.x1 <= frame.x1 + 0.5


def _ticks_apart(fig, ax) -> bool:
    renderer = _drawn(fig)
    shown = [t for t in ax.get_xticklabels() if t.get_visible() and t.get_text()]
    lo, hi = ax.get_xlim()
    shown = [t for t in shown if lo <= t.get_position()[0] <= hi]
    boxes = sorted((t.get_window_extent(renderer) for t in shown), key=lambda b: b.x0)
    return len(boxes) >= 2 and all(a.x1 <= b.x0 for a, b in zip(boxes, boxes[1:], strict=False))


def _zen_table() -> pa.Table:
    """The demo's shape: two variants, two token budgets at every size, three seeds; the rows
    shuffled, so that FLOPs order is not row order; accuracies near chance (8 items)."""
    rng = np.random.default_rng(0)
    rows = []
    for variant in ("dense", "budget"):
        for size, n in (("nano", 1.2e5), ("tiny", 3.7e5), ("micro", 1.1e6), ("mini", 4.2e6)):
            for tokens in (32_768, 98_304):
                for seed in (0, 1, 2):
                    rows.append({"variant": variant, "size": size, "n_params": n,
                                 "tokens": tokens, "flops": 6 * n * tokens, "seed": seed,
                                 "eval_scalelab_zen_acc": rng.integers(0, 9) / 8})  # fmt: skip
    order = rng.permutation(len(rows))
    return pa.Table.from_pylist([rows[i] for i in order])


def test_a_long_mechanism_title_wraps_inside_the_figure():
    plot = next(p for p in catalog.plots() if p.name == "budget_s_mean")
    fig, ax = plots.new_figure(6.0, 4.0)
    ax.plot([1e5, 1e6], [0.1, 0.2])
    text = f"{plot.title or plot.y} (each point: mean over seeds) " * 2
    plots.fit_title(ax, text)
    assert "\n" in ax.get_title() and " ".join(ax.get_title().split()) == text.strip()
    assert _inside_figure(fig, ax.title)


def test_the_downstream_plot_joins_cells_in_flops_order_with_chance_and_apart_ticks():
    fig = plots.downstream_vs_flops(_zen_table(), "eval_scalelab_zen_acc")
    ax = fig.axes[0]
    lines = {bars.get_label(): bars.lines[0] for bars in ax.containers}
    assert len(lines) == 4  # a line per variant and token budget, never across budgets
    for line in lines.values():
        x = np.asarray(line.get_xdata())
        assert x.size == 4 and np.all(np.diff(x) > 0)  # increasing FLOPs: no zig-zag
    chance = [line for line in ax.get_lines() if line.get_label().startswith("chance")]
    assert len(chance) == 1 and set(chance[0].get_ydata()) == {0.25}  # four choices
    assert _ticks_apart(fig, ax)
    assert _inside_figure(fig, ax.title)


def test_an_unknown_task_has_no_chance_line():
    assert plots.task_chance("eval_scalelab_zen_acc_norm") == 0.25
    assert plots.task_chance("eval_my_task_acc") is None
    table = _zen_table().rename_columns(
        ["eval_my_task_acc" if c.startswith("eval_") else c for c in _zen_table().column_names]
    )
    ax = plots.downstream_vs_flops(table, "eval_my_task_acc").axes[0]
    assert not [line for line in ax.get_lines() if line.get_label().startswith("chance")]


def test_log_flops_ticks_stay_apart_over_many_decades_and_under_one():
    for lo, hi in ((1e12, 1e21), (1.1e13, 5e13)):
        fig, ax = plots.new_figure(6.0, 4.0)
        ax.plot(np.geomspace(lo, hi, 9), np.linspace(0.2, 0.4, 9))
        plots.log_x_axis(ax)
        assert _ticks_apart(fig, ax), (lo, hi)


def test_only_the_laws_that_failed_are_marked_when_some_passed():
    from types import SimpleNamespace

    law = SimpleNamespace(values=lambda: {"E": 2.0, "A": 1e3, "alpha": 0.1},
                          has_E=True, fallback=False)  # fmt: skip
    fit = SimpleNamespace(laws={"dense": law, "tsa": law},
                          law_checks={"dense": SimpleNamespace(failed=False),
                                      "tsa": SimpleNamespace(failed=True)})  # fmt: skip
    assert plots.law_label(fit, "tsa").endswith(") †")
    assert plots.law_label(fit, "dense").endswith(")")
    for label in (plots.law_label(fit, v) for v in fit.laws):
        assert "check" not in label  # the words once, in the title
