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


def _gain(m: object) -> str:
    return f"{m.estimate:.2f}× [{m.low:.2f}×, {m.high:.2f}×] the FLOPs"  # type: ignore[attr-defined]


def _strings(values: tuple[str, ...]) -> pa.Array:
    import pyarrow as pa

    return pa.array(values, pa.string())
