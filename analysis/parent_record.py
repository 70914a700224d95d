"""The sweep's answer on its parent run in MLflow: each variant's gain over the baseline by
both estimators with the interval bounds, the fitted L(C) constants, and report.md (the
plots are attached by `analysis.plots.log_plots`). Logged again, as new points, each
time the sweep is summarised: the latest value is the one the UI shows."""

from __future__ import annotations

import math
import re
import tempfile
import time
from pathlib import Path
from urllib.parse import quote
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from scalelab.analysis.results.fit import SweepFit
    from scalelab.analysis.scaling import Interval


def parent_metrics(fit: SweepFit) -> dict[str, float]:
    """`gain/<variant>/paired` (and `_low`, `_high`), `gain/<variant>/unpaired` (...), and
    `law/<variant>/<constant>`; '+' in a variant's name becomes '-' (MLflow's names)."""
    out: dict[str, float] = {}
    for p in fit.paired:
        out |= _interval(f"gain/{_name(p.variant)}/paired", p.multiplier)
    for g in fit.gains:
        out |= _interval(f"gain/{_name(g.variant)}/unpaired", g.multiplier)
    for variant, law in fit.laws.items():
        for constant, value in law.values().items():
            out[f"law/{_name(variant)}/{constant}"] = float(value)
    return {k: v for k, v in out.items() if math.isfinite(v)}


def _interval(prefix: str, m: Interval) -> dict[str, float]:
    return {prefix: m.estimate, f"{prefix}_low": m.low, f"{prefix}_high": m.high}


def _name(variant: str) -> str:
    return variant.replace("+", "-")


def record_on_parent(
    parent_run_id: str | None, fit: SweepFit, report: Path, tracking_uri: str
) -> bool:
    """Log the gains and constants as metrics and attach report.md (its plots shown from the
    run's `plots/`: `in_mlflow`); False without a parent."""
    if parent_run_id is None:
        return False
    from mlflow import MlflowClient
    from mlflow.entities import Metric

    client = MlflowClient(tracking_uri)
    now = int(time.time() * 1000)
    metrics = [Metric(k, v, now, 0) for k, v in parent_metrics(fit).items()]
    for i in range(0, len(metrics), 1000):
        client.log_batch(parent_run_id, metrics=metrics[i : i + 1000])
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / report.name
        copy.write_text(in_mlflow(report.read_text(encoding="utf-8"), parent_run_id), "utf-8")
        client.log_artifact(parent_run_id, str(copy))
    return True


# an image of the report's plots/ folder: `![name](plots/loss_vs_flops.png)`
_PLOT_IMAGE = re.compile(r"!\[([^\]]*)\]\((plots/[^)\s]+)\)")


def in_mlflow(markdown: str, run_id: str) -> str:
    """report.md as the MLflow UI's artifact viewer shows it: each plot, linked relative to
    the report (results/<sweep>/plots/), is read from the run's own `plots/` artifacts
    through the UI's `get-artifact` route (relative, so any host, port or static prefix
    serves it). The viewer resolves a link against the page, not the artifact, and drops
    `data:` images, so neither the relative link nor an embedded image would show."""

    def link(m: re.Match[str]) -> str:
        return f"![{m[1]}](get-artifact?path={quote(m[2], safe='')}&run_uuid={run_id})"

    return _PLOT_IMAGE.sub(link, markdown)
