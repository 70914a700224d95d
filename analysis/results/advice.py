"""What to run next, for a synced sweep: the options (more seeds per cell, the next size
preset at every budget, one more token budget at every size) priced in FLOPs and in hours of
the hardware the sweep runs on (CPU-hours on a sweep without GPUs, GPU-hours on one that asks
for them), projected by analysis.scaling.power_analysis."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import pyarrow as pa

    from scalelab.analysis.scaling import PairedGain
    from scalelab.analysis.scaling.lsq import LsqFit
    from scalelab.analysis.scaling.power_analysis import Advice, Option
    from scalelab.orchestrator.door import SweepSpec

MAX_SEEDS = 32  # more seeds per cell than this is not advice worth giving


@dataclass(frozen=True)
class Costing:
    """Turns FLOPs into hours of the sweep's hardware. `hardware` is "cpu" (the sweep asks
    for no GPUs: CPU-hours, one core per rank, at the pace its trials ran, else at the
    plan's CPU rate), "gpu" (GPU-hours at the plan's MFU on backend.gpu, and the hours its
    trials took) or "" (hardware not recorded, e.g. an imported sweep: the plan's default
    GPU, said to be an assumption)."""

    seconds_per_flop: float  # median wall time per training FLOP of the sweep's trials
    gpu_hours_per_flop: float  # the plan's rule: 1 / (MFU x peak) / 3600, GPU or CPU rank
    assumption: str  # e.g. "40% MFU on an H100 SXM"
    hardware: str = ""  # "cpu", "gpu" or "" (not recorded)
    ranks: int = 1  # CPU cores or GPUs per trial

    def describe(self, flops: float) -> str:
        measured = np.isfinite(self.seconds_per_flop)
        as_ran = flops * self.seconds_per_flop * self.ranks / 3600
        if self.hardware == "cpu":
            cores = f"{self.ranks} core{'s' if self.ranks > 1 else ''} per trial"
            if measured:
                return f"≈ {as_ran:.2g} CPU-hours ({cores}, at the pace this sweep's trials ran)"
            return f"≈ {flops * self.gpu_hours_per_flop:.2g} CPU-hours ({cores}, {self.assumption})"
        text = f"≈ {flops * self.gpu_hours_per_flop:.2g} GPU-hours at {self.assumption}"
        if self.hardware != "gpu":
            text += " (assumed: the sweep's hardware is not recorded)"
            if measured:
                text += f", ≈ {as_ran:.2g} h of trial time at the pace its trials ran"
        elif measured:
            text += f", ≈ {as_ran:.2g} GPU-hours at the pace this sweep's trials ran"
        return text


def advice_lines(advice: Advice, cost: Costing) -> list[str]:
    """The advice as `results advise` prints it: the measured gain first (told from none, or
    the smallest addition that would tell it), then the target effect's, each addition
    priced. The end of a sweep's summary gives one of the two (verdict.next_line)."""
    lines = []
    for line, chosen, needed in (
        (advice.measured_line(), advice.for_measured, not advice.resolved),
        (advice.target_line(), advice.best, not advice.current.meets_target),
    ):
        if chosen is not None and needed:
            line += f"; {cost.describe(chosen.option.cost_flops)}"
        lines.append(line)
    return lines


def costing(table: pa.Table, spec: SweepSpec | None = None) -> Costing:
    """The pricing of `spec`'s hardware (the sweep as recorded on its parent run,
    `recorded_spec`): CPU-hours when it asks for no GPUs, else GPU-hours at its estimate's
    MFU on its GPU's peak; without it, the plan's defaults on the default GPU."""
    from scalelab.jobs.gpus import gpu_spec
    from scalelab.orchestrator.door import DEFAULT_GPU, EstimateConfig, gpu_hours

    wall = _col(table, "wall_time_s")
    flops = _col(table, "flops")
    ok = np.isfinite(wall) & (wall > 0) & (flops > 0)
    per_flop = float(np.median(wall[ok] / flops[ok])) if ok.any() else float("nan")
    if spec is None:
        est, gpu = EstimateConfig(), gpu_spec(DEFAULT_GPU)
        peak = est.peak_flops or gpu.bf16_flops
        return Costing(
            per_flop, gpu_hours(1.0, est.mfu, peak), f"{est.mfu:.0%} MFU on an {gpu.name}"
        )
    b = spec.backend
    ranks = max(1, b.world_size)
    gpus = b.gpus_per_node  # what the backend gives a trial on each node
    if not gpus:  # the plan's rule for a CPU rank (orchestrator/plan/cpu_rate.py), measured only
        rate = _cpu_rate(spec) if not np.isfinite(per_flop) else None  # when no trial timed
        per_hour = gpu_hours(1.0, rate.mfu, rate.flops) if rate else float("nan")
        return Costing(per_flop, per_hour, rate.describe() if rate else "", "cpu", ranks)
    name = b.gpu or DEFAULT_GPU
    what = f"{spec.estimate.mfu:.0%} MFU on {name} GPUs" + ("" if b.gpu else " (no backend.gpu)")
    return Costing(per_flop, gpu_hours(1.0, spec.estimate.mfu, spec.peak_flops), what, "gpu", ranks)


def _cpu_rate(spec: SweepSpec) -> Any:
    from scalelab.orchestrator.door import cpu_rate

    return cpu_rate(spec)


def recorded_spec(parent_run_id: str | None, tracking_uri: str) -> SweepSpec | None:
    """The sweep as its parent run recorded it at its last submit (its YAML and overrides,
    orchestrator/ledger/parent.py); None when there is none to read (an imported sweep, a
    parent without its YAML, a YAML this scalelab no longer accepts)."""
    if not parent_run_id:
        return None
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    from scalelab.contract.runs import Tag
    from scalelab.orchestrator.door import SpecError, parse_spec, read_long_tag

    try:
        tags = MlflowClient(tracking_uri).get_run(parent_run_id).data.tags
        text = read_long_tag(tags, Tag.SPEC_YAML)
        if text is None:
            return None
        overrides = [str(o) for o in json.loads(read_long_tag(tags, Tag.OVERRIDES) or "[]")]
        return parse_spec(text, tags.get(Tag.SPEC_PATH) or "<recorded sweep>", overrides)[0]
    except (MlflowException, SpecError, ValueError, LookupError, OSError):
        return None


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
    from scalelab.analysis.scaling.power_analysis import advise

    options = _seed_options(gain) + _new_cell_options(table, gain)
    alpha = law.values()["alpha"]
    se_alpha = float(np.sqrt(max(law.cov[-1, -1], 0.0))) if np.isfinite(law.cov).all() else 0.0
    rel = se_alpha / alpha if alpha > 0 else 0.0
    design = law.law.X[:, 0] + law.shift[0]
    return advise(gain, rel, design, options, effect=effect, power=power)


def _seed_options(gain: PairedGain) -> list[Option]:
    """k more seeds in every cell the pairs cover, k = 1..MAX_SEEDS."""
    from scalelab.analysis.scaling.power_analysis import Option

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
    from scalelab.analysis.scaling.power_analysis import Option
    from scalelab.jobs.config import JobConfig
    from scalelab.jobs.token_budget import total_tokens
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
