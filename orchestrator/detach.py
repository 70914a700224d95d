"""`scalelab submit --detach`: run the sweep driver as a Ray job, so the terminal can close.

Uses a Ray head on this machine (started with `ray start --head` on 127.0.0.1 when none
answers) and the Job Submission API; the driver inside the job joins that cluster through
RAY_ADDRESS and writes to the same tracking store as this shell would.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

from jobs import paths

DASHBOARD = os.environ.get("SCALELAB_RAY_DASHBOARD", "http://127.0.0.1:8265")
HEAD_PORT = os.environ.get("SCALELAB_RAY_PORT", "6379")
# More `ray start --head` options for the head started here, e.g. "--temp-dir=/scratch/ray
# --num-gpus=2" (Ray keeps its sessions in /tmp/ray unless told otherwise).
START_ARGS = shlex.split(os.environ.get("SCALELAB_RAY_START_ARGS", ""))


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/api/version", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def ensure_head(timeout_s: float = 90.0) -> str:
    """The dashboard address of a running Ray head, starting one on 127.0.0.1 if needed."""
    if _answers(DASHBOARD):
        return DASHBOARD
    port = DASHBOARD.rsplit(":", 1)[-1]
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    env.setdefault("RAY_AUTH_MODE", "disabled")
    cmd = [
        sys.executable, "-m", "ray.scripts.scripts", "start", "--head",
        "--node-ip-address=127.0.0.1", f"--port={HEAD_PORT}",
        "--include-dashboard=true", "--dashboard-host=127.0.0.1", f"--dashboard-port={port}",
        "--disable-usage-stats",
    ]  # fmt: skip
    cmd += START_ARGS
    started = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if started.returncode != 0:
        raise RuntimeError(f"could not start a Ray head: {started.stderr.strip()[-800:]}")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if _answers(DASHBOARD):
            return DASHBOARD
        time.sleep(1)
    raise RuntimeError(f"the Ray head started but its job server at {DASHBOARD} does not answer")


def submit_detached(sweep: Path, job: str, max_trials: int) -> tuple[str, str]:
    """Submit `scalelab submit SWEEP` as a Ray job; returns (submission id, dashboard)."""
    from ray.job_submission import JobSubmissionClient

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    address = ensure_head()
    env = {
        "SCALELAB_HOME": str(paths.scalelab_home()),
        "MLFLOW_TRACKING_URI": paths.tracking_uri(),
        "PYTHONPATH": os.pathsep.join(p for p in sys.path if p and os.path.isdir(p)),
        "RAY_USAGE_STATS_ENABLED": "0",
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
    }
    entry = [sys.executable, "-m", "orchestrator.cli", "submit", str(sweep), "--job", job,
             "--max-trials", str(max_trials)]  # fmt: skip
    client = JobSubmissionClient(address)
    job_id = client.submit_job(
        entrypoint=shlex.join(entry),
        submission_id=f"scalelab-{sweep.stem}-{uuid.uuid4().hex[:8]}",
        runtime_env={"env_vars": env},
        entrypoint_num_cpus=0,
    )
    return job_id, address
