"""The autoscaler's node-type scorer (orchestrator/backends/spot_fallback.py), through Ray's
own node-type choice (`get_nodes_for`) and availability records.

Ray is imported here as `ray_init` imports it, in single-node mode: Ray reads the mode once,
at its first import, and an embedded Ray started later in this process must come up on
127.0.0.1 (orchestrator/backends/embedded.py)."""

from __future__ import annotations

import time
from functools import partial

from scalelab.orchestrator.backends.embedded import SINGLE_NODE, scoped_environ
from scalelab.orchestrator.backends.spot_fallback import spot_first

with scoped_environ(SINGLE_NODE):
    from ray.autoscaler._private.node_provider_availability_tracker import (
        NodeAvailabilityRecord,
        NodeAvailabilitySummary,
        UnavailableNodeInformation,
    )
    from ray.autoscaler._private.resource_demand_scheduler import get_nodes_for

GPU_NODE = {"CPU": 8, "GPU": 1, "gpu_a10g": 1}
TYPES = {  # the on-demand type's name sorts last: Ray's default would pick it on a tie
    "gpu_spot": {"resources": GPU_NODE, "max_workers": 8},
    "gpu_z_ondemand": {"resources": GPU_NODE, "max_workers": 8},
    "cpu_spot": {"resources": {"CPU": 8}, "max_workers": 8},
}
TRIALS = [{"CPU": 4, "GPU": 1, "gpu_a10g": 1}] * 2


def _launch(summary: NodeAvailabilitySummary, demands=TRIALS) -> dict[str, int]:
    scorer = partial(spot_first, node_availability_summary=summary)
    to_add, _ = get_nodes_for(TYPES, {}, "head", 10, demands, scorer)
    return dict(to_add)


def _failed(node_type: str, seconds_ago: float) -> NodeAvailabilitySummary:
    why = UnavailableNodeInformation("InsufficientInstanceCapacity", "no spot capacity")
    record = NodeAvailabilityRecord(node_type, False, time.time() - seconds_ago, why)
    return NodeAvailabilitySummary({node_type: record})


def test_spot_first_then_on_demand_while_spot_launches_fail():
    assert _launch(NodeAvailabilitySummary({})) == {"gpu_spot": 2}
    assert _launch(_failed("gpu_spot", 5)) == {"gpu_z_ondemand": 2}
    assert _launch(_failed("gpu_spot", 3600)) == {"gpu_spot": 2}  # spot is tried again
    assert _launch(NodeAvailabilitySummary({}), [{"CPU": 4}]) == {"cpu_spot": 1}  # no GPU node
