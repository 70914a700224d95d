"""Cells of a sweep's design, and each variant against the baseline cell by cell.

A *cell* is one combination of the swept axes other than the variant and the seed (size,
token budget, learning rate, ...). Seeds are the replicates of a cell: a cell's loss is the
mean over its seeds and nothing else. Two trials that share the cell and the seed differ
only in the variant (same data order and initialisation seed): they are a *pair*, and their
difference cancels everything the two have in common.
"""

from __future__ import annotations

import warnings
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .data import ScalingError, ScalingWarning, column, has_column

Cell = tuple[tuple[str, Any], ...]  # ((axis, value), ...) in the order of the axes
# Default axes of a plain table (the results layer passes the axes its configs define).
DEFAULT_AXES = ("size", "tokens", "budget_flops")


@dataclass(frozen=True)
class CellComparison:
    """One variant against the baseline in one cell; losses are means over seeds and the
    difference is variant minus baseline (the mean of per-seed differences when the seeds
    pair up, with its standard error when at least two do)."""

    cell: Cell
    variant: str
    baseline: str
    loss: float
    baseline_loss: float
    loss_diff: float
    loss_diff_se: float  # NaN with fewer than two pairs
    n_pairs: int
    n_params: float
    baseline_n_params: float
    flops: float
    baseline_flops: float
    n_trials: int
    baseline_n_trials: int

    @property
    def size(self) -> str:
        return str(dict(self.cell).get("size", ""))

    @property
    def params_diff(self) -> float:
        return self.n_params - self.baseline_n_params

    @property
    def params_ratio(self) -> float:
        return self.n_params / self.baseline_n_params

    @property
    def flops_diff(self) -> float:
        return self.flops - self.baseline_flops

    @property
    def flops_ratio(self) -> float:
        return self.flops / self.baseline_flops


@dataclass(frozen=True)
class Pairs:
    """Trials of `variant` and `baseline` matched on cell and seed, one entry per pair.
    Several trials of one side in the same cell and seed (a variant's own swept settings,
    e.g. TSA's lambda) are averaged first (geometric mean of the losses)."""

    variant: str
    baseline: str
    cells: tuple[Cell, ...]
    seeds: np.ndarray
    loss: np.ndarray
    baseline_loss: np.ndarray
    flops: np.ndarray
    baseline_flops: np.ndarray
    n_averaged: int  # trials folded into a pair's mean beyond the first

    @property
    def n(self) -> int:
        return len(self.cells)

    @property
    def log_diff(self) -> np.ndarray:
        """log L_variant - log L_baseline per pair."""
        return np.log(self.loss) - np.log(self.baseline_loss)


def swept_axes(table: Any, candidates: Sequence[str] = DEFAULT_AXES) -> list[str]:
    """The candidate columns present in `table` that take more than one value (`size`
    always, when present). A nominal compute budget, when swept, replaces the trained
    tokens (which then differ between variants of different cost per token)."""
    out = []
    for name in candidates:
        if not has_column(table, name):
            continue
        values = {_plain(v) for v in column(table, name)}
        values.discard(None)
        if name == "size" or len(values) > 1:
            out.append(name)
    if "budget_flops" in out and "tokens" in out:
        out.remove("tokens")
    return out


def _plain(value: Any) -> Any:
    """A hashable, comparable cell value: numpy scalars to Python, NaN to None."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not np.isfinite(value):
        return None
    return value


class _Design:
    """A table's rows grouped by (variant label, cell, seed)."""

    def __init__(
        self,
        table: Any,
        *,
        loss: str,
        axes: Sequence[str] | None,
        arms: Sequence[str],
        seed_column: str,
        variant_column: str,
        what: str,
    ) -> None:
        self.variant = column(table, variant_column).astype(str)
        self.loss = column(table, loss).astype(float)
        if self.loss.size == 0:
            raise ScalingError(f"{what}: the results table is empty")
        self.axes = list(swept_axes(table) if axes is None else axes)
        n = self.loss.size
        values = [[_plain(v) for v in column(table, a)] for a in self.axes]
        self.cells: list[Cell] = [
            tuple((a, values[j][i]) for j, a in enumerate(self.axes)) for i in range(n)
        ]
        arm_values = [[_plain(v) for v in column(table, a)] for a in arms]
        self.arms: list[Cell] = [
            tuple((a, arm_values[j][i]) for j, a in enumerate(arms) if arm_values[j][i] is not None)
            for i in range(n)
        ]
        if seed_column and has_column(table, seed_column):
            self.seeds = [_plain(v) for v in column(table, seed_column)]
        else:  # no seed column: every trial is its own replicate, nothing pairs
            self.seeds = [("row", i) for i in range(n)]
        self.finite = np.isfinite(self.loss)

    def rows(self, variant: str) -> np.ndarray:
        return np.flatnonzero((self.variant == variant) & self.finite)


def compare_cells(
    table: Any,
    *,
    baseline: str = "dense",
    loss: str = "final_loss",
    axes: Sequence[str] | None = None,
    arms: Sequence[str] = (),
    seed_column: str = "seed",
    variant_column: str = "variant",
    params_column: str = "n_params",
    flops_column: str = "flops",
) -> list[CellComparison]:
    """One row per (variant and its `arms` settings, cell) that the baseline also ran.

    `axes` are the columns that define a cell (default: `swept_axes`); `arms` are a
    variant's own swept settings (e.g. `tsa_lambda`), which split its rows but need no
    counterpart in the baseline. Trials with a NaN loss are dropped and cells without a
    baseline are skipped, each with a `ScalingWarning`; no comparable cell raises
    `ScalingError`."""
    what = "per-cell comparison"
    d = _Design(table, loss=loss, axes=axes, arms=arms, seed_column=seed_column,
                variant_column=variant_column, what=what)  # fmt: skip
    if baseline not in set(d.variant):
        raise ScalingError(
            f"{what}: no baseline: variant {baseline!r} has no trials "
            f"(variants present: {sorted(set(d.variant))})"
        )
    n_bad = int((~d.finite).sum())
    if n_bad:
        warnings.warn(
            f"{what}: dropped {n_bad} of {d.loss.size} trials with NaN/inf loss",
            ScalingWarning,
            stacklevel=2,
        )
    params = column(table, params_column).astype(float)
    flops = column(table, flops_column).astype(float)
    groups: dict[tuple[str, Cell, Cell], list[int]] = defaultdict(list)
    for i in np.flatnonzero(d.finite):
        groups[(str(d.variant[i]), d.arms[i], d.cells[i])].append(int(i))
    base = {cell: idx for (v, _, cell), idx in groups.items() if v == baseline}
    out, missing = [], []
    for (v, arm, cell), idx in sorted(groups.items(), key=lambda kv: _order(kv[0])):
        if v == baseline:
            continue
        b = base.get(cell)
        if b is None:
            missing.append(f"{_label(v, arm)}@{_cell_text(cell)}")
            continue
        diffs = _seed_diffs(d, idx, b)
        y, yb = d.loss[idx].mean(), d.loss[b].mean()
        out.append(
            CellComparison(
                cell=cell,
                variant=_label(v, arm),
                baseline=baseline,
                loss=float(y),
                baseline_loss=float(yb),
                loss_diff=float(diffs.mean()) if diffs.size else float(y - yb),
                loss_diff_se=float(diffs.std(ddof=1) / np.sqrt(diffs.size))
                if diffs.size > 1
                else float("nan"),
                n_pairs=int(diffs.size),
                n_params=float(params[idx].mean()),
                baseline_n_params=float(params[b].mean()),
                flops=float(flops[idx].mean()),
                baseline_flops=float(flops[b].mean()),
                n_trials=len(idx),
                baseline_n_trials=len(b),
            )
        )
    if missing:
        warnings.warn(
            f"{what}: no finished {baseline!r} trial in the cell of {', '.join(missing)}",
            ScalingWarning,
            stacklevel=2,
        )
    if not out:
        raise ScalingError(f"{what}: no cell has both {baseline!r} and another variant finished")
    return out


def pair_trials(
    table: Any,
    variant: str,
    baseline: str,
    *,
    loss: str = "final_loss",
    axes: Sequence[str] | None = None,
    seed_column: str = "seed",
    variant_column: str = "variant",
    flops_column: str = "flops",
) -> Pairs:
    """Trials of `variant` and `baseline` with the same cell and seed (`Pairs`). Trials
    without a counterpart are left out; no pair at all raises `ScalingError`."""
    what = f"pairs of {variant!r} and {baseline!r}"
    d = _Design(table, loss=loss, axes=axes, arms=(), seed_column=seed_column,
                variant_column=variant_column, what=what)  # fmt: skip
    flops = column(table, flops_column).astype(float)

    def by_key(v: str) -> dict[tuple[Cell, Any], list[int]]:
        out: dict[tuple[Cell, Any], list[int]] = defaultdict(list)
        for i in d.rows(v):
            out[(d.cells[i], d.seeds[i])].append(int(i))
        return out

    mine, theirs = by_key(variant), by_key(baseline)
    keys = sorted(set(mine) & set(theirs), key=lambda k: (_order(("", (), k[0])), str(k[1])))
    if not keys:
        raise ScalingError(
            f"{what}: no trials share a cell ({', '.join(d.axes) or 'no axes'}) and a seed"
        )

    def mean(rows: list[int]) -> tuple[float, float]:
        return float(np.exp(np.log(d.loss[rows]).mean())), float(flops[rows].mean())

    v_side = [mean(mine[k]) for k in keys]
    b_side = [mean(theirs[k]) for k in keys]
    extra = sum(len(mine[k]) - 1 + len(theirs[k]) - 1 for k in keys)
    return Pairs(
        variant=variant,
        baseline=baseline,
        cells=tuple(k[0] for k in keys),
        seeds=np.array([k[1] for k in keys], dtype=object),
        loss=np.array([v[0] for v in v_side]),
        baseline_loss=np.array([b[0] for b in b_side]),
        flops=np.array([v[1] for v in v_side]),
        baseline_flops=np.array([b[1] for b in b_side]),
        n_averaged=extra,
    )


def cell_means(
    table: Any,
    variant: str,
    *,
    loss: str = "final_loss",
    axes: Sequence[str] | None = None,
    variant_column: str = "variant",
    flops_column: str = "flops",
) -> tuple[np.ndarray, np.ndarray]:
    """(mean FLOPs, geometric-mean loss) of each of `variant`'s cells: the independent
    points a law through a sweep with seeds should be fitted on (a cell's seeds share
    its offset from the law, so fitting every seed would count that offset many times)."""
    d = _Design(table, loss=loss, axes=axes, arms=(), seed_column="", variant_column=variant_column,
                what=f"cells of {variant!r}")  # fmt: skip
    flops = column(table, flops_column).astype(float)
    groups: dict[Cell, list[int]] = defaultdict(list)
    for i in d.rows(variant):
        groups[d.cells[i]].append(int(i))
    if not groups:
        raise ScalingError(f"cells of {variant!r}: no finished trials")
    rows = list(groups.values())
    return (
        np.array([flops[r].mean() for r in rows]),
        np.array([np.exp(np.log(d.loss[r]).mean()) for r in rows]),
    )


def _seed_diffs(d: _Design, rows: list[int], base: list[int]) -> np.ndarray:
    """Per-seed differences (variant minus baseline) over the seeds both sides ran."""
    mine: dict[Any, list[float]] = defaultdict(list)
    theirs: dict[Any, list[float]] = defaultdict(list)
    for i in rows:
        mine[d.seeds[i]].append(d.loss[i])
    for i in base:
        theirs[d.seeds[i]].append(d.loss[i])
    return np.array([np.mean(mine[s]) - np.mean(theirs[s]) for s in mine if s in theirs])


def _label(variant: str, arm: Cell) -> str:
    if not arm:
        return variant
    return f"{variant} ({', '.join(f'{k}={v}' for k, v in arm)})"


def _cell_text(cell: Cell) -> str:
    return ",".join(str(v) for _, v in cell)


def _order(key: tuple[str, Cell, Cell]) -> tuple:
    """Sort by variant and arm, then cell values (numbers before text, None last)."""
    variant, arm, cell = key

    def sortable(v: Any) -> tuple:
        if v is None:
            return (2, "")
        return (0, float(v)) if isinstance(v, (int, float)) else (1, str(v))

    return (variant, [sortable(v) for _, v in arm], [sortable(v) for _, v in cell])
