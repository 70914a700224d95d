"""The compute-optimal allocation at given budgets, from each variant's Chinchilla law
L(N, D) and its bootstrap: N*(C), D*(C) and tokens per parameter, each with its interval
(the same resamples' laws evaluated at C; docs/scaling.md). C = 6 N D, as in
`ChinchillaFit.optimal`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import pyarrow as pa

    from scalelab.analysis.scaling import Bootstrap, Interval


@dataclass(frozen=True)
class Allocation:
    variant: str
    flops: float
    n_opt: Interval
    d_opt: Interval
    tokens_per_param: Interval

    def to_dict(self) -> dict[str, Any]:
        from .json_values import interval, num

        return {
            "variant": self.variant,
            "flops": num(self.flops),
            "n_opt": interval(self.n_opt),
            "d_opt": interval(self.d_opt),
            "tokens_per_param": interval(self.tokens_per_param),
        }

    def metrics(self) -> dict[str, float]:
        """`optimal/<variant>/C_<budget>/{N,D,tokens_per_param}` (and `_low`, `_high`), as
        MLflow's metric names allow ('+' to '-', no '@')."""
        budget = f"{self.flops:.3g}".replace("+", "")
        prefix = f"optimal/{self.variant.replace('+', '-')}/C_{budget}"
        out = {}
        for name, i in (("N", self.n_opt), ("D", self.d_opt),
                        ("tokens_per_param", self.tokens_per_param)):  # fmt: skip
            out |= {f"{prefix}/{name}": i.estimate, f"{prefix}/{name}_low": i.low,
                    f"{prefix}/{name}_high": i.high}  # fmt: skip
        return out


def allocate(variant: str, law: Bootstrap, budgets: tuple[float, ...]) -> list[Allocation]:
    """N*, D* and D*/N* at each budget: the point law's, with percentile intervals over the
    bootstrap's resampled laws (each resample's G, a and b together)."""
    from scalelab.analysis.scaling.bootstrap import percentile_interval

    s = law.samples
    out = []
    for c in budgets:
        n_point, d_point = (float(x) for x in law.point.optimal(c))
        c6 = c / 6.0
        n = s["G"] * c6 ** s["a"]
        d = c6 ** s["b"] / s["G"]
        ok = np.isfinite(n) & np.isfinite(d) & (n > 0)
        out.append(
            Allocation(
                variant,
                float(c),
                percentile_interval(n[ok], n_point, law.level),
                percentile_interval(d[ok], d_point, law.level),
                percentile_interval(d[ok] / n[ok], d_point / n_point, law.level),
            )
        )
    return out


def default_budgets(table: pa.Table) -> tuple[float, ...]:
    """Without --budget: the sweep's largest compute, and 10x and 100x it (1 digit)."""
    flops = table["flops"].to_numpy(zero_copy_only=False).astype(float)
    flops = flops[np.isfinite(flops) & (flops > 0)]
    if flops.size == 0:
        return ()
    top = float(f"{flops.max():.1g}")
    return (top, 10 * top, 100 * top)


def parse_budgets(text: str) -> tuple[float, ...]:
    """'1e21,1e22' -> (1e21, 1e22); ValueError naming a bad one."""
    out = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        try:
            value = float(part)
        except ValueError:
            raise ValueError(f"--budget {part!r}: not a number of FLOPs") from None
        if not np.isfinite(value) or value <= 0:
            raise ValueError(f"--budget {part!r}: expected a positive number of FLOPs")
        out.append(value)
    if not out:
        raise ValueError("--budget: expected FLOPs, e.g. 1e21,1e22")
    return tuple(out)


def allocation_rows(allocations: list[Allocation]) -> tuple[list[str], list[list[str]]]:
    if not allocations:
        return [], []
    level = allocations[0].n_opt.level
    head = ["variant", "budget C (FLOPs)", "N*", f"{level:.0%} CI", "D* (tokens)",
            f"{level:.0%} CI ", "tokens / param", f"{level:.0%} CI  "]  # fmt: skip
    rows = []
    for a in allocations:
        row = [a.variant, f"{a.flops:.3g}"]
        for i in (a.n_opt, a.d_opt, a.tokens_per_param):
            row += [f"{i.estimate:.3g}", f"[{i.low:.3g}, {i.high:.3g}]"]
        rows.append(row)
    return head, rows
