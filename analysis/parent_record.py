"""The sweep's answer on its parent run in MLflow: each variant's gain over the baseline by
both estimators with the interval bounds, the fitted L(C) constants, and report.md (the
plots are attached by `analysis.plots.log_plots`). Logged again, as new points, each
time the sweep is summarised: the latest value is the one the UI shows."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import TYPE_CHECKING

from scalelab.analysis.report_html import report_html

if TYPE_CHECKING:
    from scalelab.analysis.results.fit import SweepFit
    from scalelab.analysis.scaling import Interval


def parent_metrics(fit: SweepFit) -> dict[str, float]:
    """`gain/<variant>/paired` (and `_low`, `_high`), `gain/<variant>/unpaired` (...),
    `law/<variant>/<constant>`, and the compute-optimal allocation
    `optimal/<variant>/C_<budget>/{N,D,tokens_per_param}` (...); '+' in a variant's name
    becomes '-' (MLflow's names)."""
    out: dict[str, float] = {}
    for p in fit.paired:
        out |= _interval(f"gain/{_name(p.variant)}/paired", p.multiplier)
    for g in fit.gains:
        out |= _interval(f"gain/{_name(g.variant)}/unpaired", g.multiplier)
    for variant, law in fit.laws.items():
        for constant, value in law.values().items():
            out[f"law/{_name(variant)}/{constant}"] = float(value)
    for allocation in fit.allocation:
        out |= allocation.metrics()
    return {k: v for k, v in out.items() if math.isfinite(v)}


def _interval(prefix: str, m: Interval) -> dict[str, float]:
    return {prefix: m.estimate, f"{prefix}_low": m.low, f"{prefix}_high": m.high}


def _name(variant: str) -> str:
    return variant.replace("+", "-")


def record_on_parent(
    parent_run_id: str | None, fit: SweepFit, report: Path, tracking_uri: str
) -> bool:
    """Log the gains and constants as metrics and attach report.md and report.html (the
    same, its plots embedded: what the MLflow UI shows of it); False without a parent."""
    if parent_run_id is None:
        return False
    from mlflow import MlflowClient
    from mlflow.entities import Metric

    client = MlflowClient(tracking_uri)
    now = int(time.time() * 1000)
    metrics = [Metric(k, v, now, 0) for k, v in parent_metrics(fit).items()]
    for i in range(0, len(metrics), 1000):
        client.log_batch(parent_run_id, metrics=metrics[i : i + 1000])
    client.log_artifact(parent_run_id, str(report))
    page = report.with_suffix(".html")
    page.write_text(
        report_html(report.read_text("utf-8"), report.parent, f"sweep {fit.sweep}"), "utf-8"
    )
    client.log_artifact(parent_run_id, str(page))
    return True
