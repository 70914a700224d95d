"""A cloud Ray cluster on this machine: a head and Ray's fake multi-node autoscaler.

The autoscaler is Ray's own, with the provider Ray tests it with (`fake_multinode`, which
starts each "node" as a raylet of its own on this machine: what
`ray.cluster_utils.AutoscalingCluster` starts). That class itself is not used: Ray 2.60's
wheel lacks the example config it reads, and its start and shutdown run
`ray stop --force`, which stops every Ray process of this user on the machine, other
tests' and other people's included. Here only this cluster's processes are stopped (those
holding a file open in its temp dir, as orchestrator/backends/watchdog.py finds them).

Like the embedded Ray (orchestrator/backends/embedded.py) it listens on 127.0.0.1 only
(Ray's single-node mode, which the fake provider's nodes follow) and wants a token
(RAY_AUTH_MODE=token, set explicitly). Its nodes get the environment of this process
without SCALELAB_HOME or MLFLOW_TRACKING_URI: a trial learns them from its driver.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import suppress
from pathlib import Path

import psutil

from scalelab.orchestrator.backends.watchdog import SESSION_VAR, end_clusters

HEAD_NODE_ID = "f" * 51 + "00000"  # the fake provider numbers the head 0, workers 1, 2, ...


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class FakeCloud:
    """`FakeCloud(root, worker_types).start()`; `address`, `env()` for a driver, `nodes()`."""

    def __init__(self, root: Path, worker_types: dict, idle_timeout_s: float) -> None:
        self.root = root
        self.port = _free_port()
        self.token = root / "auth_token"
        # Ray's temp dir, short: its sockets' paths must fit AF_UNIX's 107 bytes
        self.ray_dir = Path(tempfile.mkdtemp(prefix="fake-cloud-"))
        self.mark = secrets.token_hex(8)  # on every process of the cluster (SESSION_VAR)
        self.config = {
            "cluster_name": "fake-cloud",
            "max_workers": sum(t["max_workers"] for t in worker_types.values()),
            "provider": {
                "type": "fake_multinode",
                "use_node_id_as_ip": True,
                "disable_node_updaters": True,
                "disable_launch_config_check": True,
                "gcs_address": f"127.0.0.1:{self.port}",  # not Ray's default 6379
            },
            "available_node_types": {
                "ray.head.default": {"resources": {}, "node_config": {}, "max_workers": 0},
                **{
                    name: {"node_config": {}, "min_workers": 0, **spec}
                    for name, spec in worker_types.items()
                },
            },
            "head_node_type": "ray.head.default",
            "idle_timeout_minutes": idle_timeout_s / 60,
            "upscaling_speed": 1.0,
            "auth": {},
            "docker": {},
            "file_mounts": {},
            **{
                k: []
                for k in (
                    "initialization_commands",
                    "setup_commands",
                    "head_setup_commands",
                    "worker_setup_commands",
                    "head_start_ray_commands",
                    "worker_start_ray_commands",
                    "cluster_synced_files",
                    "rsync_exclude",
                    "rsync_filter",
                )
            },  # fmt: skip
            "file_mounts_sync_continuously": False,
        }

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        """Ray's settings a driver of this cluster needs: its token, and single-node mode
        (else Ray swaps the loopback address for the host's network address)."""
        return {
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN_PATH": str(self.token),
            "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        }

    def start(self) -> FakeCloud:
        self.root.mkdir(parents=True, exist_ok=True)
        self.token.write_text(secrets.token_hex(32))
        self.token.chmod(0o600)
        config = self.root / "autoscaling.json"
        config.write_text(json.dumps(self.config))
        env = {k: v for k, v in os.environ.items()
               if k not in ("SCALELAB_HOME", "MLFLOW_TRACKING_URI", "RAY_ADDRESS")}  # fmt: skip
        env |= self.env() | {
            "RAY_FAKE_CLUSTER": "1",  # the fake provider's switch
            "AUTOSCALER_UPDATE_INTERVAL_S": "1",
            "RAY_USAGE_STATS_ENABLED": "0",
            SESSION_VAR: self.mark,
        }
        cmd = [
            sys.executable, "-m", "ray.scripts.scripts", "start", "--head",
            "--node-ip-address=127.0.0.1", f"--port={self.port}",
            f"--autoscaling-config={config}", "--num-cpus=0",  # no trial on the head
            "--include-dashboard=false", "--disable-usage-stats",
            f"--temp-dir={self.ray_dir}", "--object-store-memory=100000000",
            f"--ray-client-server-port={_free_port()}",
            f"--dashboard-agent-listen-port={_free_port()}",
        ]  # fmt: skip
        started = subprocess.run(cmd, env=env, cwd=self.root, capture_output=True, text=True)
        if started.returncode != 0:
            self.stop()
            raise RuntimeError(f"the fake cloud's head did not start: {started.stderr[-2000:]}")
        return self

    def raylets(self) -> dict[str, psutil.Process]:
        """The live nodes: node id -> its raylet."""
        inside = str(self.ray_dir)
        found = {}
        for proc in psutil.process_iter(["name", "cmdline"]):
            with suppress(psutil.Error):
                args = proc.info["cmdline"] or []
                if proc.info["name"] == "raylet" and any(inside in a for a in args):
                    node = next(a for a in args if a.startswith("--node_id="))
                    found[node.split("=", 1)[1]] = proc
        return found

    def workers(self) -> set[str]:
        return set(self.raylets()) - {HEAD_NODE_ID}

    def wait_for_workers(self, count: int, timeout_s: float) -> float:
        """Seconds until the cluster has `count` worker nodes."""
        start = time.monotonic()
        while len(self.workers()) != count:
            if time.monotonic() - start > timeout_s:
                raise AssertionError(f"{sorted(self.workers())} after {timeout_s} s, not {count}")
            time.sleep(0.5)
        return time.monotonic() - start

    def reclaim(self, node_id: str) -> None:
        """The node goes away at once, as a cloud takes back a spot instance: its raylet and
        every process under it (the trial's worker) are killed."""
        raylet = self.raylets()[node_id]
        procs = [raylet, *raylet.children(recursive=True)]
        for proc in procs:
            with suppress(psutil.Error):
                proc.kill()
        psutil.wait_procs(procs, timeout=10)

    def stop(self) -> None:
        end_clusters(self.mark, str(self.ray_dir))
        shutil.rmtree(self.ray_dir, ignore_errors=True)
