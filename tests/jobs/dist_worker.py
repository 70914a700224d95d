"""One rank of a multi-process test (started by torchrun from test_distributed.py).

Usage: torchrun --nproc_per_node 2 dist_worker.py SPEC.json
SPEC: {"runs": [{"home": "...", "job": {...JobConfig...}}, ...], "out": "results.json"}
The process group is created once here, so the runs share it (run() sees an existing group
and leaves it alone) and the test pays for process start-up only once.
"""

import json
import os
import sys
from dataclasses import asdict

import torch.distributed as dist

from jobs.config import JobConfig
from jobs.train import run


def main() -> None:
    spec = json.loads(open(sys.argv[1]).read())
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


if __name__ == "__main__":
    main()
