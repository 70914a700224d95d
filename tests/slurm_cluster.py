"""A real single-node SLURM for the test suite, started by scripts/slurm/start.sh.

tests/conftest.py imports the fixture:  ``from tests.slurm_cluster import slurm_cluster``
(or ``from slurm_cluster import slurm_cluster`` when tests/ is not a package).

Where the cluster cannot start because this is not root or there is no apt-get, SLURM tests
skip with that reason; when the environment variable CI is set (CI=true), any failure to
start fails the session instead, so CI never silently skips them. The daemons keep running
after the session (a second start is ~0.3 s); ``scripts/slurm/stop.sh`` stops them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
START = REPO / "scripts" / "slurm" / "start.sh"

# start.sh exit codes meaning "this machine cannot host the cluster" (not a bug in it).
NOT_ROOT, NO_PACKAGES = 2, 3


@dataclass(frozen=True)
class SlurmCluster:
    """What a test needs to submit to the local cluster."""

    partition: str
    node: str
    logs: Path
    start_seconds: float


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in {"", "0", "false", "no"}


def cannot_start(reason: str) -> None:
    """Skip, or fail under CI, because the cluster cannot run here."""
    if in_ci():
        pytest.fail(f"SLURM test cluster did not start (CI is set, so no skip): {reason}")
    pytest.skip(f"SLURM test cluster unavailable: {reason}")


def start_cluster(timeout_s: float = 600) -> SlurmCluster:
    """Run start.sh (installs packages the first time) and describe the running cluster."""
    if os.geteuid() != 0:
        cannot_start(f"needs root to install and run the SLURM daemons (uid {os.geteuid()})")
    if shutil.which("sinfo") is None and shutil.which("apt-get") is None:
        cannot_start("SLURM is not installed and there is no apt-get to install it")
    logs = Path(os.environ.get("SCALELAB_SLURM_LOGS", "/var/log/scalelab-slurm"))
    began = time.perf_counter()
    proc = subprocess.run(
        ["bash", str(START)], capture_output=True, text=True, timeout=timeout_s, check=False
    )
    seconds = time.perf_counter() - began
    if proc.returncode in (NOT_ROOT, NO_PACKAGES):
        errors = [line for line in proc.stderr.splitlines() if line.startswith("[slurm] ERROR:")]
        cannot_start(errors[0].removeprefix("[slurm] ERROR: ") if errors else proc.stderr[-500:])
    if proc.returncode != 0:
        pytest.fail(
            f"scripts/slurm/start.sh failed (exit {proc.returncode}); logs in {logs}\n{proc.stderr}"
        )
    return SlurmCluster(
        partition="debug", node=os.uname().nodename.split(".")[0], logs=logs, start_seconds=seconds
    )


@pytest.fixture(scope="session")
def slurm_cluster() -> SlurmCluster:
    """A running single-node SLURM with accounting (sacct), shared by the whole session."""
    return start_cluster()


TWO_NODES = REPO / "scripts" / "slurm" / "two-nodes.sh"


@pytest.fixture(scope="session")
def two_node_cluster(slurm_cluster: SlurmCluster) -> Path:
    """A second cluster of 2 nodes on this host (two slurmd, scripts/slurm/two-nodes.sh):
    the path of its config, for SLURM_CONF."""
    proc = subprocess.run(
        ["bash", str(TWO_NODES)], capture_output=True, text=True, timeout=300, check=False
    )
    if proc.returncode != 0:
        pytest.fail(f"scripts/slurm/two-nodes.sh failed (exit {proc.returncode})\n{proc.stderr}")
    line = proc.stdout.strip().splitlines()[-1]
    return Path(line.removeprefix("SLURM_CONF="))
