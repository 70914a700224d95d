"""A user's RAY_object_spilling_config (a spilling directory, set the way Ray's docs once
said) made the embedded Ray warn that it is an unstable API, once in the driver and once
more per worker, into the output of `scalelab submit`: a cluster started here now gets the
directory through ray.init's stable `object_spilling_directory`, and its processes do not
inherit the variable."""

from __future__ import annotations

import json
import os
import subprocess
import sys

# a fresh process starts the embedded Ray (the session's Ray is started already) and runs a
# task, so a worker starts too: each process that read the variable warned
START = """
import json
from scalelab.orchestrator.backends.base import ray_init, ray_shutdown
ray_init("local", embedded=True, workers=1)
import ray  # after ray_init, which imports it in single-node mode
print(ray.get(ray.remote(lambda: 1).options(num_cpus=0).remote()))
print("SPILL " + json.loads(ray._private.worker._global_node._object_spilling_config)
      ["params"]["directory_path"])
ray_shutdown()
"""
WARNING = "object spilling config is specified from an unstable"


def test_a_spilling_directory_set_for_ray_is_used_without_ray_warning(tmp_path, work_home):
    spill = tmp_path / "spill"
    config = {"type": "filesystem", "params": {"directory_path": str(spill)}}
    env = {**os.environ, "RAY_object_spilling_config": json.dumps(config)}
    for var in ("PYTEST_CURRENT_TEST", "BUILDKITE"):  # Ray says nothing in its own tests
        env.pop(var, None)
    done = subprocess.run(
        [sys.executable, "-c", START], env=env, capture_output=True, text=True, timeout=180
    )
    seen = done.stdout + done.stderr
    assert done.returncode == 0, seen[-3000:]
    assert WARNING not in seen, seen[-3000:]
    assert f"SPILL {spill}" in done.stdout  # the user's directory, still
