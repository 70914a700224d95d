"""The ranks' side of tests/two_ranks.py (started by tests/forked_ranks.py, one process per
rank): train_runs(SPEC.json) with
SPEC: {"runs": [{"home": "...", "job": {...JobConfig...}}, ...], "out": "results.json"}
The process group is created once here, so the runs share it (run() sees an existing group
and leaves it alone). train_alone(SPEC.json) runs one job whose ranks start the group
themselves (run() reads RANK / WORLD_SIZE as under torchrun).
"""

import json
import os
from dataclasses import asdict

import torch.distributed as dist

from scalelab.jobs.config import JobConfig
from scalelab.jobs.training.train import run


def train_runs(spec_path: str) -> None:
    spec = json.loads(open(spec_path).read())
    dist.init_process_group("gloo")
    results = []
    for item in spec["runs"]:
        os.environ["SCALELAB_HOME"] = item["home"]
        results.append(asdict(run(JobConfig.model_validate(item["job"]))))
    if dist.get_rank() == 0:
        with open(spec["out"], "w") as f:
            json.dump(results, f)
    dist.barrier()
    dist.destroy_process_group()


def train_alone(spec_path: str) -> None:
    """One run whose ranks start their process group themselves, as under a launcher."""
    spec = json.loads(open(spec_path).read())
    [item] = spec["runs"]
    os.environ["SCALELAB_HOME"] = item["home"]
    result = asdict(run(JobConfig.model_validate(item["job"])))
    if os.environ["RANK"] == "0":
        with open(spec["out"], "w") as f:
            json.dump([result], f)


def late_rank(out_path: str, timeout_minutes: str) -> None:
    """Rank 0 waits in a barrier for rank 1, which is 6 s late; rank 0 records how the
    wait ended (the process group's timeout is `timeout_minutes`)."""
    import time

    from scalelab.jobs.training import distributed

    env = distributed.read_environment()
    distributed.init(env, float(timeout_minutes))
    if env.rank == 1:
        time.sleep(6)
        return
    t0 = time.monotonic()
    try:
        dist.barrier()
        outcome = "met"
    except RuntimeError as e:
        outcome = f"{type(e).__name__}: {e}"
    with open(out_path, "w") as f:
        json.dump({"outcome": outcome, "waited_s": time.monotonic() - t0}, f)
