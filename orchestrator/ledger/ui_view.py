"""What the MLflow UI shows of a sweep's runs, set from the sweep (docs/monitoring.md, "In the
MLflow UI"): a saved view of the runs and each trial's colour.

MLflow 3.17's runs table has no experiment-level default for its columns, grouping or charts:
a browser keeps its own per experiment. What an experiment can carry is saved views, the
experiment tags `mlflow.sharedViewState.<id>` its "Views" menu lists (and an address with
`viewStateShareKey=<id>` opens). scalelab saves one, `scalelab-trials`: the trials grouped by
variant, the swept settings, `val/loss`, FLOPs, tokens and parameters as columns, every run
in the charts (not the first ten), the loss charts against `compute/flops`, each run in its
variant's colour (the run tag `mlflow.runColor`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import TYPE_CHECKING

from scalelab.contract.runs import VARIANT_COLOURS, ExperimentTag, Param, Tag
from scalelab.jobs.tracking.provenance import mlflow_params
from scalelab.orchestrator.trial_names import swept_settings

if TYPE_CHECKING:
    from scalelab.orchestrator.expand import Trial

VIEW_NAME = "scalelab: trials by variant"
METRICS = ("val/loss", "train/loss", "compute/flops", "compute/tokens")
X_METRIC = "compute/flops"  # line charts' x-axis: loss against training compute


def variant_colours(variants: Iterable[str]) -> dict[str, str]:
    """variant -> hex colour, in sorted order: the plots' colours (analysis/plots.py colours
    fit.variants, sorted, with the same palette)."""
    return {
        v: VARIANT_COLOURS[i % len(VARIANT_COLOURS)] for i, v in enumerate(sorted(set(variants)))
    }


def view_state(swept_params: list[str]) -> dict[str, object]:
    """The state the UI restores from the view: its runs-table and chart settings (the keys
    of MLflow 3.17's `ExperimentPageUIState` and search facets)."""
    columns = [f"tags.`{Tag.VARIANT}`", "params.`model.size`"]
    columns += [f"params.`{key}`" for key in swept_params if key != "model.size"]
    columns += [f"metrics.`{m}`" for m in METRICS] + [f"params.`{Param.N_PARAMS}`"]
    return {
        "selectedColumns": columns,
        "groupBy": {
            "aggregateFunction": "min",  # a group's row: its best val/loss
            "groupByKeys": [{"mode": "tag", "groupByData": Tag.VARIANT}],
        },
        "useGroupedValuesInCharts": False,  # every trial its own line, in its variant's colour
        "runsHiddenMode": "SHOW_ALL",  # the UI's default charts the first ten runs only
        "hideEmptyCharts": True,
        "chartsSearchFilter": "loss",  # the loss charts first (the search box over the charts)
        "globalLineChartConfig": {
            "xAxisKey": "metric",
            "selectedXAxisMetricKey": X_METRIC,
            "lineSmoothness": 0,
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
