"""What the MLflow UI shows of a sweep's runs, set from the sweep (docs/monitoring.md, "In the
MLflow UI"): a saved view of the runs and each trial's colour.

MLflow 3.17's runs table has no experiment-level default for its columns, grouping or charts:
a browser keeps its own per experiment. What an experiment can carry is saved views, the
experiment tags `mlflow.sharedViewState.<id>` its "Views" menu lists (and an address with
`viewStateShareKey=<id>` opens). scalelab saves one, `scalelab-trials`: the trials grouped by
variant; `val/loss` the first column after the run's name, then the swept settings, tokens,
parameters and the run time (`scalelab.run_s`, seconds: MLflow's Duration counts from the
first launch, waits between attempts included); every run in the charts (not the first ten), each in its variant's colour
(the run tag `mlflow.runColor`); and the charts it opens on (`compareRunsMode=CHART` in the
address, `cli/watch.py`), in the sections `val` and `train` before the others:

- `val/loss` against GFLOPs, both axes log: the metric `val/loss_at_gflop` (val/loss logged
  with step = GFLOPs) against step. MLflow's line chart takes `xAxisScaleType: "log"` only
  on a step x-axis; against a metric (`compute/flops`) its x-axis is always linear.
- `val/loss` and `train/loss` against `compute/flops`: linear x (MLflow's only choice there),
  log y, for the exact FLOPs of each point.

What the view cannot hold: a number format for a metric column (MLflow formats only its own
system metrics), so the raw `compute/flops` column is left out of the table.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import TYPE_CHECKING

from scalelab.contract.runs import VARIANT_COLOURS, ExperimentTag, Metric, Param, Tag
from scalelab.jobs.tracking.provenance import mlflow_params
from scalelab.orchestrator.plan.trial_names import swept_settings

if TYPE_CHECKING:
    from scalelab.orchestrator.plan.expand import Trial

VIEW_NAME = "scalelab: trials by variant"
X_METRIC = "compute/flops"  # the loss charts' x-axis where it is a metric: training compute
VAL_LOSS, TRAIN_LOSS = "val/loss", "train/loss"
# the table's metric columns, val/loss first; compute/flops is not one: MLflow prints it as a
# raw integer cut to the column's width, and a view has no number format for it
TABLE_METRICS = (VAL_LOSS, TRAIN_LOSS, "compute/tokens")
SECTIONS = ("val", "train")  # the chart sections first, in this order (MLflow: alphabetical)


def variant_colours(variants: Iterable[str]) -> dict[str, str]:
    """variant -> hex colour, in sorted order: the plots' colours (analysis/plots.py colours
    fit.variants, sorted, with the same palette)."""
    return {
        v: VARIANT_COLOURS[i % len(VARIANT_COLOURS)] for i, v in enumerate(sorted(set(variants)))
    }


def _section_id(name: str) -> str:
    return f"scalelab-section-{name}"


def _line_chart(
    uuid: str, metric: str, title: str, *, x_metric: str | None, log_x: bool
) -> dict[str, object]:
    """One line chart card as MLflow 3.17 keeps it (`RunsChartsLineCardConfig`): `metric`
    against step (`x_metric` None) or against the metric `x_metric`; y always log."""
    return {
        "type": "LINE",
        "uuid": uuid,
        "metricSectionId": _section_id(metric.split("/")[0]),
        "isGenerated": False,
        "deleted": False,
        "displayName": title,
        "metricKey": metric,
        "selectedMetricKeys": [metric],
        "xAxisKey": "metric" if x_metric else "step",
        "selectedXAxisMetricKey": x_metric or "",
        "useGlobalXaxisKey": False,  # its own x-axis, whatever the workspace's
        "xAxisScaleType": "log" if log_x else "linear",
        "scaleType": "log",
        "range": {"xMin": None, "xMax": None, "yMin": None, "yMax": None},
        "lineSmoothness": 0,
        "useGlobalLineSmoothing": False,
        "yAxisKey": "metric",
        "yAxisExpressions": [],
        "ignoreOutliers": False,
        "runsCountToCompare": 100,
    }


def charts() -> list[dict[str, object]]:
    """The charts the view opens on, in order (the rest MLflow adds after them)."""
    return [
        _line_chart(
            "scalelab-val-loss-gflop", Metric.VAL_LOSS_AT_GFLOP,
            "val/loss against GFLOPs (log-log; x: step = GFLOPs)", x_metric=None, log_x=True,
        ),
        _line_chart(
            "scalelab-val-loss-flops", VAL_LOSS,
            f"val/loss against {X_METRIC} (log y)", x_metric=X_METRIC, log_x=False,
        ),
        _line_chart(
            "scalelab-train-loss-flops", TRAIN_LOSS,
            f"train/loss against {X_METRIC} (log y)", x_metric=X_METRIC, log_x=False,
        ),
    ]  # fmt: skip


def sections() -> list[dict[str, object]]:
    """The chart sections `val` then `train`; MLflow appends the others after them."""
    return [
        {"uuid": _section_id(name), "name": name, "display": True, "isReordered": True,
         "deleted": False, "isGenerated": False}
        for name in SECTIONS
    ]  # fmt: skip


def view_state(swept_params: list[str]) -> dict[str, object]:
    """The state the UI restores from the view: its runs-table and chart settings (the keys
    of MLflow 3.17's `ExperimentPageUIState` and search facets)."""
    params = ["params.`model.size`"]
    params += [f"params.`{key}`" for key in swept_params if key != "model.size"]
    metrics = [f"metrics.`{m}`" for m in TABLE_METRICS]
    variant, n_params = f"tags.`{Tag.VARIANT}`", f"params.`{Param.N_PARAMS}`"
    run_s = f"tags.`{Tag.RUN_S}`"  # the run time: MLflow's Duration counts waits between attempts
    # the table's order: val/loss first (right after the run's name, which stays pinned)
    order = [metrics[0], variant, *params, *metrics[1:], n_params, run_s]
    return {
        "selectedColumns": [variant, *params, *metrics, n_params, run_s],
        "columnOrder": order,
        "groupBy": {
            "aggregateFunction": "min",  # a group's row: its best val/loss
            "groupByKeys": [{"mode": "tag", "groupByData": Tag.VARIANT}],
        },
        "useGroupedValuesInCharts": False,  # every trial its own line, in its variant's colour
        "runsHiddenMode": "SHOW_ALL",  # the UI's default charts the first ten runs only
        "hideEmptyCharts": True,
        "compareRunCharts": charts(),
        "compareRunSections": sections(),
        "isAccordionReordered": True,  # keep the sections' order (else alphabetical)
        "globalLineChartConfig": {
            "xAxisKey": "step",
            "lineSmoothness": 0,
            "selectedXAxisMetricKey": "",
        },
        "orderByKey": "attributes.start_time",
        "orderByAsc": False,
    }


def view_tags(trials: list[Trial], created_ms: int) -> dict[str, str]:
    """The experiment tag that saves scalelab's view of these trials (MLflow's saved-view
    envelope: name, times, and the state as a JSON string)."""
    keys: dict[str, None] = {}
    for settings in swept_settings(trials).values():
        keys.update(dict.fromkeys(settings))
    params = {k for t in trials for k in mlflow_params(t.job)}
    swept = [k for k in keys if k in params]
    envelope = {
        "name": VIEW_NAME,
        "createdAt": created_ms,
        "updatedAt": created_ms,
        "state": json.dumps(view_state(swept)),
    }
    return {ExperimentTag.VIEW_PREFIX + ExperimentTag.TRIALS_VIEW: json.dumps(envelope)}


def same_view(current: str | None, wanted: str) -> bool:
    """Whether the saved view `current` already has `wanted`'s name and state (its times
    differ each submit)."""
    if current is None:
        return False
    try:
        old, new = json.loads(current), json.loads(wanted)
    except ValueError:
        return False
    return isinstance(old, dict) and all(old.get(k) == new[k] for k in ("name", "state"))
