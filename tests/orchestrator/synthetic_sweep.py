"""A synthetic sweep written exactly as a real one is (for tests, benchmarks and docs).

Real MLflow runs (experiment = sweep, parent `sweep:<name>`, child runs with the scalelab
tags, the flattened JobConfig as params, metrics via log_batch) and real trial
directories (job.json, curves.jsonl, result.json), with losses drawn from a known law:

    L_v(C) = E + A * (C / m_v)^(-alpha)

so variant v reaches any loss with m_v times the baseline's FLOPs (m_v < 1: cheaper).
C = 6 N D. Every metric an active mechanism declares (models/mechanism.py) gets a curve
from one formula of N, the training fraction t and its settings (`mechanism_curve`).
Nothing here trains a model.
"""

from __future__ import annotations

import itertools
import json
import time
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from scalelab.contract import workdir
from scalelab.contract.trial_time import timestamp_text
from scalelab.jobs.tracking.provenance import mlflow_params

LAW_E, LAW_A, LAW_ALPHA = 1.7, 270.0, 0.15
# shape="chinchilla": Hoffmann et al.'s published fit, with the variant's multiplier applied
# to the data term, L = E + A/N^alpha + B/(D/m)^beta (loss then depends on N at fixed C,
# which IsoFLOP profiles need)
CHINCHILLA = {"E": 1.69, "A": 406.4, "B": 410.7, "alpha": 0.34, "beta": 0.28}


@dataclass(frozen=True)
class SyntheticTrial:
    trial_id: str
    run_id: str
    variant: str
    size: str
    n_params: int
    tokens: int
    flops: float
    final_loss: float
    status: str
    curve: dict[str, np.ndarray] = field(repr=False, default_factory=dict)


def law(
    flops: np.ndarray | float, multiplier: float = 1.0, n_params: float | None = None
) -> np.ndarray:
    """Loss at training compute C (shape 'compute'), or at (N, D = C / 6N) when n_params
    is given (shape 'chinchilla')."""
    c = np.asarray(flops, float)
    if n_params is None:
        return LAW_E + LAW_A * (c / multiplier) ** -LAW_ALPHA
    k = CHINCHILLA
    d = c / (6.0 * n_params)
    return k["E"] + k["A"] / n_params ** k["alpha"] + k["B"] / (d / multiplier) ** k["beta"]


def write_sweep(
    sweep: str,
    *,
    sizes: Sequence[str] = ("nano", "micro", "mini", "124M"),
    multipliers: dict[str, float] | None = None,
    tokens_per_param: Sequence[float] = (10, 20, 40),
    isoflop: Sequence[float] = (),
    mechanism_settings: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
    seeds: Sequence[int] = (0,),
    steps: int = 20,
    noise: float = 0.005,
    nan_variants: Sequence[str] = (),
    status: str = "FINISHED",
    local_files: bool = True,
    log_metrics: bool = False,
    tracking_uri: str | None = None,
    rng_seed: int = 0,
    shape: str = "compute",
    run_time_s: float | None = None,
) -> list[SyntheticTrial]:
    """Write the sweep; return its trials. `isoflop` budgets (FLOPs) replace the
    tokens_per_param axis: each size trains on C / (6 N) tokens. `mechanism_settings` lists,
    per mechanism, the settings its trials take (one trial each; default one with
    lambda_depth 0.01 for tsa and the defaults for the others). Trials of `nan_variants`
    get a NaN final loss (diverged). With `run_time_s`, each run is launched as a driver
    launches it (`Ledger.start_run`: its start, `scalelab.started`, 3 s queued) and ends
    that many seconds later, its job's own clock (result.json) saying less."""
    from mlflow import MlflowClient

    from scalelab.jobs.config import JobConfig, TrainConfig
    from scalelab.models import catalog
    from scalelab.models.config import ModelConfig
    from scalelab.models.flops import count_params

    multipliers = multipliers or {"dense": 1.0, "hadamard": 0.8}
    rng = np.random.default_rng(rng_seed)
    client = MlflowClient(tracking_uri or workdir.tracking_uri())
    exp = client.get_experiment_by_name(sweep)
    eid = (
        exp.experiment_id
        if exp
        else client.create_experiment(sweep, workdir.artifact_root().as_uri())
    )
    parent = client.create_run(
        eid,
        run_name=f"sweep:{sweep}",
        tags={"scalelab.role": "sweep", "scalelab.sweep": sweep},
    ).info.run_id
    ctx = _Context(
        client, eid, parent, sweep, steps, noise, status, local_files, log_metrics, rng, shape,
        run_time_s,
    )  # fmt: skip
    budgets: list[tuple[str, float | None]] = [("tokens_per_param", t) for t in tokens_per_param]
    if isoflop:
        budgets = [("flops", c) for c in isoflop]
    out = []
    settings = {"tsa": ({"lambda_depth": 0.01},), **(mechanism_settings or {})}
    for variant, m in multipliers.items():
        on = catalog.variant_fields(variant)
        arms = [
            dict(zip(on, combo, strict=True))
            for combo in itertools.product(*(settings.get(name, ({},)) for name in on))
        ]
        for size in sizes:
            for kind, amount in budgets:
                for arm in arms:
                    for seed in seeds:
                        model = ModelConfig(size=size, vocab_size=256, block_size=256, **arm)
                        n = count_params(model)
                        tokens = (
                            int(amount * n) if kind == "tokens_per_param" else int(amount / (6 * n))
                        )
                        job = JobConfig(model=model, train=TrainConfig(**{kind: amount}), seed=seed)
                        diverged = variant in nan_variants
                        out.append(_write_trial(ctx, job, variant, n, tokens, m, diverged))
    client.set_terminated(parent, status="FINISHED")
    return out


def mechanism_curve(metric: str, config: Any, n: int, frac: np.ndarray) -> np.ndarray:
    """A mechanism's metric over training, in [0, 1]: a level set by the metric's name and
    log N, rising with t in proportion to the settings that differ from their defaults."""
    from scalelab.jobs.identity import science

    numbers = [v for v in science(config, "").values() if not isinstance(v, bool)]
    level = 0.1 + (zlib.crc32(metric.encode()) % 100) / 500 + 0.02 * np.log10(n)
    push = sum(v for v in numbers if isinstance(v, int | float))
    return np.clip(level + 2.0 * push * frac, 0.0, 1.0)


@dataclass(frozen=True)
class _Context:
    client: Any
    eid: str
    parent: str
    sweep: str
    steps: int
    noise: float
    status: str
    local_files: bool
    log_metrics: bool
    rng: np.random.Generator
    shape: str
    run_time_s: float | None = None


def _write_trial(
    ctx: _Context, job: Any, variant: str, n: int, tokens: int, m: float, diverged: bool
) -> SyntheticTrial:
    from mlflow.entities import Metric, Param, RunTag

    from scalelab.models.mechanism import mechanism_of

    client, eid, parent, sweep = ctx.client, ctx.eid, ctx.parent, ctx.sweep
    steps, noise, status, rng = ctx.steps, ctx.noise, ctx.status, ctx.rng
    tid = job.trial_id
    size = job.model.size
    tags = {
        "mlflow.parentRunId": parent,
        "scalelab.role": "trial",
        "scalelab.sweep": sweep,
        "scalelab.trial_id": tid,
        "scalelab.variant": variant,
        "scalelab.size": size,
        "scalelab.backend": "local",
        "scalelab.job_ref": "",
        "scalelab.code_version": "synthetic",
    }
    start_ms = int(time.time() * 1000 - (ctx.run_time_s or 0) * 1000)
    if ctx.run_time_s is not None:
        tags.update({"scalelab.started": timestamp_text(start_ms), "scalelab.queued_s": "3.0"})
    run_name = f"{variant}-{size}-{tid[:8]}"
    run_id = client.create_run(eid, start_time=start_ms, run_name=run_name).info.run_id
    params = mlflow_params(job)
    params.update({"n_params": str(n), "tokens": str(tokens)})
    items = [Param(k, v) for k, v in params.items()]
    tag_items = [RunTag(k, v) for k, v in tags.items()]
    for i in range(0, max(len(items), len(tag_items)), 100):
        client.log_batch(run_id, params=items[i : i + 100], tags=tag_items[i : i + 100])
    flops = 6.0 * n * tokens
    n_law = n if ctx.shape == "chinchilla" else None

    def law_at(c: np.ndarray | float) -> np.ndarray:
        return law(c, m, n_law)

    final = float(law_at(flops) * np.exp(rng.normal(0, noise)))
    if diverged:
        final = float("nan")
    frac = np.arange(1, steps + 1) / steps
    c = flops * frac
    val = law_at(c) * (final / law_at(flops)) if not diverged else law_at(c)
    if diverged:
        val[-1] = np.nan
    curve = {
        "val/loss": val,
        "train/loss": val * 1.02,
        "compute/flops": c,
        "compute/tokens": np.rint(tokens * frac),
    }
    for config in job.model.mechanisms.values():
        for metric in mechanism_of(config).metrics:
            curve[metric] = mechanism_curve(metric, config, n, frac)
    step_no = np.arange(1, steps + 1)
    tok = np.rint(tokens * frac).astype(np.int64)
    if ctx.local_files:
        tdir = workdir.trial_dir(tid)
        tdir.mkdir(parents=True, exist_ok=True)
        (tdir / workdir.JOB_FILE).write_text(job.model_dump_json(indent=2))
        lines = [
            json.dumps(
                {
                    "step": int(s),
                    "tokens": int(t),
                    "flops": float(cc),
                    "metric": k,
                    "value": float(v[i]),
                }
            )
            for i, (s, t, cc) in enumerate(zip(step_no, tok, c, strict=True))
            for k, v in curve.items()
        ]
        (tdir / workdir.CURVES_FILE).write_text("\n".join(lines) + "\n")
        if status == "FINISHED":
            result = {
                "status": status, "reason": "", "trial_id": tid, "run_id": run_id,
                "steps": steps, "tokens": tokens, "flops": flops, "final_val_loss": final,
                "best_val_loss": float(np.nanmin(val)) if np.isfinite(val).any() else None,
                "n_params": n, "n_nonembed": None, "wall_time_s": 1.5,
            }  # fmt: skip
            (tdir / workdir.RESULT_FILE).write_text(json.dumps(result))
    if ctx.log_metrics:
        now = int(time.time() * 1000)
        metrics = [
            Metric(k, float(v[i]), now, int(s))
            for i, s in enumerate(step_no)
            for k, v in curve.items()
            if np.isfinite(v[i])
        ]
        for i in range(0, len(metrics), 1000):
            client.log_batch(run_id, metrics=metrics[i : i + 1000])
    if status in ("FINISHED", "FAILED", "KILLED"):
        end = None if ctx.run_time_s is None else start_ms + int(ctx.run_time_s * 1000)
        client.set_terminated(run_id, status=status, end_time=end)
    else:
        client.update_run(run_id, status=status)
    return SyntheticTrial(tid, run_id, variant, size, n, tokens, flops, final, status, curve)
