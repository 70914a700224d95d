"""`scalelab submit --detach`: run the sweep driver as a Ray job, so the terminal can close.

Uses a Ray head on this machine (started with `ray start --head` when none answers) and the
Job Submission API; the driver inside the job joins that cluster through RAY_ADDRESS and
writes to the same tracking store as this shell would. The head started here listens on
127.0.0.1 only and requires the token in $SCALELAB_HOME/ray/auth_token (made once, mode 0600)
from every client, this one included (orchestrator.backends.embedded). It outlives this
command on purpose: stop it with `ray stop` or by its processes.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

from scalelab.contract import workdir
from scalelab.orchestrator.backends.embedded import (
    SINGLE_NODE,
    TOKEN_FILE,
    driver_pythonpath,
    user_chose_auth,
    write_token,
)

DASHBOARD = os.environ.get("SCALELAB_RAY_DASHBOARD", "http://127.0.0.1:8265")
HEAD_PORT = os.environ.get("SCALELAB_RAY_PORT", "6379")
# More `ray start --head` options for the head started here, e.g. "--temp-dir=/scratch/ray
# --num-gpus=2" (Ray keeps its sessions in /tmp/ray unless told otherwise).
START_ARGS = shlex.split(os.environ.get("SCALELAB_RAY_START_ARGS", ""))


def head_token() -> Path | None:
    """The token file of the head this home starts (None: the user set Ray's auth vars)."""
    return None if user_chose_auth() else write_token(workdir.scalelab_home() / "ray" / TOKEN_FILE)


def _headers(token: Path | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token.read_text().strip()}"} if token else {}


def _answer(url: str, headers: dict[str, str]) -> int | None:
    """The HTTP status of the head's job server, or None when nothing answers."""
    request = urllib.request.Request(url + "/api/version", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=2) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return None


def _usable(url: str, headers: dict[str, str]) -> bool:
    """Whether a head answers at `url`; one that refuses this home's token is an error. With
    the user's own RAY_AUTH_* settings (no headers here), Ray's client sends their token."""
    status = _answer(url, headers)
    if status in (401, 403) and headers:
        raise RuntimeError(
            f"a Ray head answers at {url} but refuses this home's token "
            f"({workdir.scalelab_home() / 'ray' / TOKEN_FILE}): it was started by someone else "
            "or from another SCALELAB_HOME; stop it, or set SCALELAB_RAY_DASHBOARD to "
            "another port"
        )
    return status == 200 or (status is not None and not headers)


def ensure_head(timeout_s: float = 90.0) -> str:
    """The dashboard address of a running Ray head, starting one on 127.0.0.1 if needed."""
    token = head_token()
    headers = _headers(token)
    if _usable(DASHBOARD, headers):
        return DASHBOARD
    port = DASHBOARD.rsplit(":", 1)[-1]
    env = {**os.environ, **SINGLE_NODE, "RAY_USAGE_STATS_ENABLED": "0"}
    if token:
        env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(token))
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
        if _usable(DASHBOARD, headers):
            return DASHBOARD
        time.sleep(0.2)  # one local request per look: a second between looks was idle time
    raise RuntimeError(f"the Ray head started but its job server at {DASHBOARD} does not answer")


def submit_detached(
    sweep: Path, job: str, max_trials: int, overrides: list[str] | None = None
) -> tuple[str, str]:
    """Submit `scalelab submit SWEEP` as a Ray job; returns (submission id, dashboard)."""
    from ray.job_submission import JobSubmissionClient

    from scalelab.models.catalog import MECHANISMS_ENV
    from scalelab.orchestrator.backends.registry import BACKENDS_ENV

    address = ensure_head()
    env = {
        "SCALELAB_HOME": str(workdir.scalelab_home()),
        "MLFLOW_TRACKING_URI": workdir.tracking_uri(),
        "PYTHONPATH": driver_pythonpath(),
        "RAY_USAGE_STATS_ENABLED": "0",
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
    }
    for name in (MECHANISMS_ENV, BACKENDS_ENV):  # code outside scalelab the driver needs
        if os.environ.get(name):
            env[name] = os.environ[name]
    entry = [sys.executable, "-m", "scalelab.cli.main", "submit", str(sweep), "--job", job,
             "--max-trials", str(max_trials), *(overrides or [])]  # fmt: skip
    client = JobSubmissionClient(address, headers=_headers(head_token()))
    job_id = client.submit_job(
        entrypoint=shlex.join(entry),
        submission_id=f"scalelab-{sweep.stem}-{uuid.uuid4().hex[:8]}",
        runtime_env={"env_vars": env},
        entrypoint_num_cpus=0,
    )
    return job_id, address
