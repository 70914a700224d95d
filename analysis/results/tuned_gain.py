"""A tuned sweep's two comparisons (`tune:`, docs/results.md, "Fairness checks").

The sweep's own trials ("ladder", orchestrator/plan/tuning.py) ran every variant at its own
tuned rate and, by default, every other variant also at the baseline's. The gain the
summary reads is the first one: each variant at its own optimum, paired with the baseline
at its own, the rate being a variant's own setting there and not a cell axis. The second,
every variant at the baseline's rate, is what an untuned sweep would have reported; both
are printed, so a reader sees how much tuning changes the answer. The search's trials
(stage "tune") are in neither.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa

    from scalelab.analysis.results.fit import SweepFit

LADDER_STAGES = ("ladder", "tune+ladder")
RATE = "lr"  # the trials table's column of train.lr


@dataclass(frozen=True)
class RateSplit:
    own: pa.Table  # each variant's ladder trials at its own tuned rate
    shared: pa.Table  # every variant's ladder trials at the baseline's rate
    rates: dict[str, float]  # variant -> its own rate
    baseline: str

    @property
    def baseline_rate(self) -> float:
        return self.rates[self.baseline]


def split_by_rate(table: pa.Table, baseline: str) -> RateSplit | None:
    """The two comparisons' trials of a tuned sweep; None for a sweep without `tune:` (no
    stage recorded) or whose baseline has no ladder trials at one rate yet."""
    import pyarrow.compute as pc

    if "stage" not in table.column_names or table["stage"].null_count == table.num_rows:
        return None
    ladder = table.filter(pc.is_in(table["stage"], value_set=_strings(LADDER_STAGES)))
    rates_of: dict[str, set[float]] = {}
    for variant, rate in zip(ladder["variant"].to_pylist(), ladder[RATE].to_pylist(), strict=True):
        rates_of.setdefault(variant, set()).add(rate)
    if len(rates_of.get(baseline, ())) != 1:
        return None
    (base_rate,) = rates_of[baseline]
    rates = {v: min(r - {base_rate} or {base_rate}) for v, r in rates_of.items()}
    own = [rates[v] == r for v, r in zip(ladder["variant"].to_pylist(), ladder[RATE].to_pylist(), strict=True)]  # fmt: skip
    shared = pc.equal(ladder[RATE], base_rate)
    return RateSplit(ladder.filter(own), ladder.filter(shared), rates, baseline)


def fairness_lines(own: SweepFit, shared: SweepFit | None, split: RateSplit) -> list[str]:
    """One line per variant: its paired gain at its own tuned rate and at the baseline's,
    and whether tuning changes the reading."""
    from scalelab.analysis.results.render import reading

    out = []
    for p in own.paired:
        rate = split.rates.get(p.variant)
        line = f"tuned: {p.variant} at its own rate ({rate:.3g}): {_gain(p.multiplier)}"
        q = shared.paired_gain(p.variant) if shared is not None else None
        if rate == split.baseline_rate:
            line += f" (its optimum is {split.baseline}'s rate)"
        elif q is not None:
            line += (
                f"; at {split.baseline}'s rate ({split.baseline_rate:.3g}): {_gain(q.multiplier)}"
            )
            if reading(p.multiplier) != reading(q.multiplier):
                line += " — tuning changes the answer"
        out.append(line)
    return out


def loss_gap_lines(split: RateSplit) -> list[str]:
    """Where no law can be fitted (too few compute points: one size, two sizes): each
    variant's final validation loss less the baseline's in the same cell (same size,
    tokens, seed), at its own tuned rate and at the baseline's."""
    own, shared = _gaps(split.own, split.baseline), _gaps(split.shared, split.baseline)
    out = []
    for variant, gaps in sorted(own.items()):
        rate = split.rates[variant]
        line = (
            f"tuned: {variant} - {split.baseline} in final val loss, cell by cell, at its own "
            f"rate ({rate:.3g}): {_gap_text(gaps)}"
        )
        if rate == split.baseline_rate:
            line += f" (its optimum is {split.baseline}'s rate)"
        elif shared.get(variant):
            line += f"; at {split.baseline}'s rate ({split.baseline_rate:.3g}): "
            line += _gap_text(shared[variant])
        out.append(line)
    return out


def _gaps(table: pa.Table, baseline: str) -> dict[str, list[tuple[str, float]]]:
    """Each variant's loss less the baseline's, per cell both trained: (cell, gap)."""
    from scalelab.analysis.results.design import read_design

    design = read_design(table, per_variant=(f"train.{RATE}",))
    rows = design.table.to_pylist()
    cells: dict[tuple, dict[str, float]] = {}
    for r in rows:
        if r.get("final_val_loss") is None:
            continue
        key = (*(r.get(a) for a in design.axes), r.get("seed"))
        cells.setdefault(key, {})[r["variant"]] = r["final_val_loss"]
    out: dict[str, list[tuple[str, float]]] = {}
    for key, losses in sorted(cells.items(), key=lambda kv: str(kv[0])):
        if baseline not in losses:
            continue
        label = " ".join(str(v) for v in key[:-1]) + ("" if key[-1] is None else f" s{key[-1]}")
        for variant, loss in losses.items():
            if variant != baseline:
                out.setdefault(variant, []).append((label.strip(), loss - losses[baseline]))
    return out


def _gap_text(gaps: list[tuple[str, float]]) -> str:
    mean = sum(g for _, g in gaps) / len(gaps)
    cells = ", ".join(f"{label} {g:+.3f}" for label, g in gaps[:6])
    more = f", {len(gaps) - 6} more" if len(gaps) > 6 else ""
    return f"{mean:+.3f} nats on average over {len(gaps)} cell(s) ({cells}{more})"


def _gain(m: object) -> str:
    return f"{m.estimate:.2f}× [{m.low:.2f}×, {m.high:.2f}×] the FLOPs"  # type: ignore[attr-defined]


def _strings(values: tuple[str, ...]) -> pa.Array:
    import pyarrow as pa

    return pa.array(values, pa.string())
