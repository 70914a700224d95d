"""Spot first, on-demand when the cloud has none: a node-type scorer for Ray's autoscaler.

Ray's cluster launcher (autoscaler v1) picks, for trials waiting for resources, the node type
its utilization scorer ranks best, and takes a scorer from the head's environment:

    RAY_AUTOSCALER_UTILIZATION_SCORER=scalelab.orchestrator.backends.spot_fallback.spot_first

This one ranks as Ray's default does, except that among the types that fit, one whose name
ends in `_spot` comes first, and a type whose last launch failed (the cloud had no spot
capacity: the provider's NodeLaunchException, which Ray's availability tracker records) is
passed over for `SCALELAB_SPOT_RETRY_S` seconds (default 600), so the same trials go to the
on-demand type that offers the same resources. docs/running-on-ray.md has a cluster file.
"""

from __future__ import annotations

import os
import time
from typing import Any

SPOT_SUFFIX = "_spot"


def retry_after_s() -> float:
    return float(os.environ.get("SCALELAB_SPOT_RETRY_S", "600"))


def spot_first(
    node_resources: dict[str, float],
    resources: list[dict[str, float]],
    node_type: str,
    *,
    node_availability_summary: Any,
) -> tuple | None:
    """Ray's UtilizationScorer: None when this type is not to be launched now."""
    from ray.autoscaler._private.resource_demand_scheduler import _default_utilization_scorer

    record = node_availability_summary.node_availabilities.get(node_type)
    if (
        record is not None
        and not record.is_available
        and time.time() - record.last_checked_timestamp < retry_after_s()
    ):
        return None
    score = _default_utilization_scorer(
        node_resources, resources, node_type, node_availability_summary=node_availability_summary
    )
    if score is None:
        return None
    gpu_ok, *rest = score  # Ray's first criterion stays first: no GPU node for CPU work
    return (gpu_ok, node_type.endswith(SPOT_SUFFIX), *rest)
