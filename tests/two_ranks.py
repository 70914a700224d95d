"""Training jobs on 2 gloo ranks under torchrun, in one launch (process start-up is paid
once): tests/jobs/dist_worker.py runs each (home, job) in turn on both ranks."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

WORKER = Path(__file__).with_name("jobs") / "dist_worker.py"
LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train_on_two_ranks(runs: list[tuple[Path, Any]], tmp_path: Path) -> list[dict]:
    """Each run's result as rank 0 saw it (jobs.train's TrainResult as a dict)."""
    spec, out = tmp_path / "spec.json", tmp_path / "out.json"
    items = [{"home": str(home), "job": json.loads(job.model_dump_json())} for home, job in runs]
    spec.write_text(json.dumps({"runs": items, "out": str(out)}))
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS}
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
         "--master_addr", "127.0.0.1", "--master_port", str(free_port()), str(WORKER), str(spec)],
        env={**env, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=400,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(out.read_text())
