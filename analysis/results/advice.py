"""What to run next, for a synced sweep: the options (more seeds per cell, the next size
preset at every budget, one more token budget at every size) priced in FLOPs, GPU-hours and
this machine's measured trial time, projected by analysis.scaling.advice."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import pyarrow as pa

    from scalelab.analysis.scaling import PairedGain
    from scalelab.analysis.scaling.advice import Advice, Option
    from scalelab.analysis.scaling.lsq import LsqFit

MAX_SEEDS = 32  # more seeds per cell than this is not advice worth giving


@dataclass(frozen=True)
class Costing:
    """Turns FLOPs into GPU-hours (the plan's assumptions, orchestrator.spec) and into
    trial time as measured by this sweep's trials."""

    seconds_per_flop: float  # median wall time per training FLOP of the sweep's trials
    gpu_hours_per_flop: float
    assumption: str  # e.g. "40% MFU on an H100 SXM"

    def describe(self, flops: float) -> str:
        text = f"≈ {flops * self.gpu_hours_per_flop:.2g} GPU-hours at {self.assumption}"
        if np.isfinite(self.seconds_per_flop):
            text += f", ≈ {flops * self.seconds_per_flop / 3600:.2g} h of trial time as run here"
        return text


def advice_lines(advice: Advice, cost: Costing) -> list[str]:
    """The advice as printed (`results advise`, the end of a sweep's summary): the measured
    gain first (told from none, or the smallest addition that would tell it), then the
    target effect's, each addition priced."""
    lines = []
    for line, chosen, needed in (
        (advice.measured_line(), advice.for_measured, not advice.resolved),
        (advice.target_line(), advice.best, not advice.current.meets_target),
    ):
        if chosen is not None and needed:
            line += f"; {cost.describe(chosen.option.cost_flops)}"
        lines.append(line)
    return lines


def costing(table: pa.Table) -> Costing:
    """The plan's default assumptions (the trials do not record their sweep's backend.gpu):
    EstimateConfig's MFU on the default GPU's peak."""
    from scalelab.jobs.gpus import gpu_spec
    from scalelab.orchestrator.expand import gpu_hours
    from scalelab.orchestrator.spec import DEFAULT_GPU, EstimateConfig

    est = EstimateConfig()
    gpu = gpu_spec(DEFAULT_GPU)
    wall = _col(table, "wall_time_s")
    flops = _col(table, "flops")
    ok = np.isfinite(wall) & (wall > 0) & (flops > 0)
    per_flop = float(np.median(wall[ok] / flops[ok])) if ok.any() else float("nan")
    peak = est.peak_flops or gpu.bf16_flops
    return Costing(per_flop, gpu_hours(1.0, est.mfu, peak), f"{est.mfu:.0%} MFU on an {gpu.name}")


def advise_gain(
    table: pa.Table,
    gain: PairedGain,
    law: LsqFit,
    *,
    effect: float = 0.05,
    power: float = 0.8,
) -> Advice:
    """Advice for one variant's paired gain (`law`: the baseline slope's fit, through its
    cell means)."""
    from scalelab.analysis.scaling.advice import advise

    options = _seed_options(gain) + _new_cell_options(table, gain)
    alpha = law.values()["alpha"]
    se_alpha = float(np.sqrt(max(law.cov[-1, -1], 0.0))) if np.isfinite(law.cov).all() else 0.0
    rel = se_alpha / alpha if alpha > 0 else 0.0
    design = law.law.X[:, 0] + law.shift[0]
    return advise(gain, rel, design, options, effect=effect, power=power)


def _seed_options(gain: PairedGain) -> list[Option]:
    """k more seeds in every cell the pairs cover, k = 1..MAX_SEEDS."""
    from scalelab.analysis.scaling.advice import Option

    p = gain.pairs
    per_cell: dict[Any, float] = {}
    for cell, fv, fb in zip(p.cells, p.flops, p.baseline_flops, strict=True):
        per_cell[cell] = fv + fb  # one more seed: one variant and one baseline trial
    cost = sum(per_cell.values())
    n_cells = len(per_cell)
    return [
        Option(
            f"{k} more seed{'s' if k > 1 else ''} per cell",
            k * n_cells,
            (),
            k * cost,
            2 * k * n_cells,
        )  # fmt: skip
        for k in range(1, MAX_SEEDS + 1)
    ]


def _new_cell_options(table: pa.Table, gain: PairedGain) -> list[Option]:
    """The next size preset at every budget, and 3x the largest token budget at every size
    (each with the sweep's seeds per cell), priced from the configs of the trials they
    extend."""
    import pyarrow.compute as pc

    from scalelab.models.sizes import SIZES

    p = gain.pairs
    seeds = max(1, round(p.n / len(set(p.cells))))
    rows = table.filter(pc.is_in(table["variant"], value_set=_strings([p.variant, p.baseline])))
    trials = [
        (v, json.loads(c))
        for v, c in zip(rows["variant"].to_pylist(), rows["config"].to_pylist(), strict=True)
        if c
    ]
    if not trials:
        return []
    out = []
    order = list(SIZES)
    ran = [c["model"]["size"] for _, c in trials if c["model"]["size"] in order]
    largest = max(ran, key=order.index) if ran else None
    if largest is not None and order.index(largest) + 1 < len(order):
        bigger = order[order.index(largest) + 1]

        def resize(cfg: dict[str, Any]) -> dict[str, Any]:
            model = dict(cfg["model"], size=bigger, n_layer=None, d_model=None, n_head=None)
            return {**cfg, "model": model}

        out.append(_priced(trials, p.baseline, f"size {bigger} at every budget", seeds,
                           resize, lambda cfg: cfg["model"]["size"] == largest))  # fmt: skip
    tokens = [c["train"].get("tokens") for _, c in trials]
    if all(isinstance(t, int) for t in tokens):
        top = max(tokens)

        def lengthen(cfg: dict[str, Any]) -> dict[str, Any]:
            return {**cfg, "train": dict(cfg["train"], tokens=3 * top)}

        out.append(_priced(trials, p.baseline, f"{3 * top:,} tokens at every size", seeds,
                           lengthen, lambda cfg: cfg["train"]["tokens"] == top))  # fmt: skip
    return [o for o in out if o is not None]


def _priced(
    trials: list[tuple[str, dict[str, Any]]],
    baseline: str,
    label: str,
    seeds: int,
    change: Any,
    which: Any,
) -> Option | None:
    """An option whose new trials are change(config) for every distinct config `which`
    picks, `seeds` times each; None when a changed config is invalid (a width the variant
    cannot use)."""
    from scalelab.analysis.scaling.advice import Option
    from scalelab.jobs.budget import total_tokens
    from scalelab.jobs.config import JobConfig
    from scalelab.models.flops import count_params, train_flops_per_token

    seen: set[str] = set()
    new_flops, cost = [], 0.0
    for variant, cfg in trials:
        if not which(cfg):
            continue
        changed = change({k: v for k, v in cfg.items() if k != "seed"})
        key = json.dumps(changed, sort_keys=True)
        if key in seen:
            continue
        seen.add(key)
        try:
            job = JobConfig.model_validate(changed)
        except ValueError:
            return None
        n = count_params(job.model)
        flops = total_tokens(job, n) * train_flops_per_token(job.model, job.data.seq_len)
        cost += seeds * flops
        if variant == baseline:
            new_flops.append(flops)
    if not new_flops:
        return None
    label += f" ({seeds} seed{'s' if seeds > 1 else ''} per cell)"
    return Option(label, seeds * len(new_flops), tuple(new_flops), cost, seeds * len(seen))


def _strings(values: list[str]) -> Any:
    import pyarrow as pa

    return pa.array(values, pa.string())


def _col(table: pa.Table, name: str) -> np.ndarray:
    return table[name].to_numpy(zero_copy_only=False).astype(float)
