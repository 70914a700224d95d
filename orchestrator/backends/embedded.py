"""The boundary of the Ray that scalelab starts on this machine: the embedded cluster of the
`local` and `slurm` backends (`ray.init(address="local")`) and the head of `submit --detach`.
docs/reliability.md ("Security: what listens, who is let in") says what it guarantees.

- Loopback only. Ray's single-node mode (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, its default on
  macOS and Windows) makes the node's address 127.0.0.1, and every server of the cluster
  follows the node's address: GCS, raylet and object manager, the workers' gRPC servers, the
  dashboard and runtime-env agents, the metrics exporters; no other machine can join.
  `ray.init(_node_ip_address="127.0.0.1")` or `ray start --node-ip-address=127.0.0.1` alone
  does not do it: in cluster mode Ray swaps a loopback address for the host's network address.
  Ray reads the mode once, when it is first imported.
- A token. Loopback is open to every user of the machine, so the cluster also requires a
  token: Ray >= 2.59 turns token authentication on for a cluster `ray.init` starts, and reads
  the token from RAY_AUTH_TOKEN_PATH, here a random one in a file only this user can read,
  instead of generating ~/.ray/auth_token (whose mere presence turns token auth on for the
  user's other Ray clusters). RAY_AUTH_MODE, RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH set by the
  user win.
- Private files. The clusters' Ray temp dir (sessions, logs, sockets) and the token are in
  a folder only this user can enter (mode 0700), instead of the shared /tmp/ray: Ray makes
  its temp dir and the session, logs and sockets folders in it world-writable (0777), so
  the temp dir itself cannot be the boundary. The watchdog removes the folder when the
  driver has exited.
- Fate sharing. A watchdog process (orchestrator.backends.watchdog) ends every process of the
  driver's clusters when the driver exits: those carrying SCALELAB_RAY_SESSION=<mark>, or
  holding a file open in that temp dir.

The variables are set only while `ray.init` starts the cluster, so what the driver starts
afterwards (sbatch jobs inherit the submitting environment) carries none of them.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import psutil

from scalelab.jobs.environ import scoped_environ
from scalelab.orchestrator.backends.watchdog import PRIVATE_PREFIX, SESSION_VAR, end_clusters

SINGLE_NODE = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
AUTH_VARS = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")
TOKEN_FILE = "auth_token"
RAY_AUTH_LOGGER = "ray._private.authentication.authentication_token_setup"


SPILL_ENV = "RAY_object_spilling_config"  # Ray's unstable way to say where objects spill
RAY_NODE_LOGGER = "ray._private.node"


def _not_the_unstable_spilling_advice(record: logging.LogRecord) -> bool:
    """Ray warns, in every process that reads RAY_object_spilling_config, that it is an
    unstable API: the user's setting, not scalelab's, and nothing a sweep's user can act on."""
    return "object spilling config is specified from an unstable" not in record.getMessage()


def spilling_directory() -> str | None:
    """The directory of a RAY_object_spilling_config that says no more than one directory
    on the filesystem: a cluster started here gets it through ray.init's stable
    `object_spilling_directory` (which does not warn), and its processes do not inherit the
    variable (which makes each of them warn: the driver, and each worker as it starts). Any
    other config (another storage, buffer sizes) is left to Ray as it is."""
    text = os.environ.get(SPILL_ENV)
    try:
        config = json.loads(text) if text else None
    except ValueError:
        return None
    if not isinstance(config, dict) or config.get("type") != "filesystem":
        return None
    params = config.get("params")
    if (
        set(config) - {"type", "params"}
        or not isinstance(params, dict)
        or set(params) != {"directory_path"}
    ):
        return None
    path = params["directory_path"]
    if isinstance(path, list) and len(path) == 1:
        path = path[0]
    return path if isinstance(path, str) and path else None


def _not_the_opt_out_advice(record: logging.LogRecord) -> bool:
    """Ray warns, each time it turns token auth on by default, that RAY_AUTH_MODE=disabled
    opts out: for this cluster the token is the boundary, not a default to question."""
    return "to opt out" not in record.getMessage()


def write_token(path: Path) -> Path:
    """A new 256-bit token (the kind `ray get-auth-token --generate` makes) in a file only
    this user can read; an existing file is kept as it is."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))
    return path


def user_chose_auth() -> bool:
    return any(var in os.environ for var in AUTH_VARS)


def driver_pythonpath() -> str:
    """PYTHONPATH for the processes the driver starts (the watchdog, Ray workers, a Ray
    job): the folders it imports from, so they import what it imports (scalelab, the job
    function's module, tests' helpers)."""
    return os.pathsep.join(p for p in sys.path if p and os.path.isdir(p))


class DriverSession:
    """What the embedded clusters of one driver process share: the mark on their processes,
    a private Ray temp dir holding the token, and the watchdog that ends them when the driver
    exits. One per process: Ray caches the token it read, so every cluster the process
    starts must use the same one."""

    def __init__(self) -> None:
        self.mark = uuid.uuid4().hex
        self.private = Path(tempfile.mkdtemp(prefix=PRIVATE_PREFIX))  # mode 0700
        self.temp_dir = self.private / "ray"  # Ray's: world-writable, reached through private
        token = self.private / TOKEN_FILE
        self.auth = {} if user_chose_auth() else {"RAY_AUTH_TOKEN_PATH": str(write_token(token))}
        cmd = [sys.executable, "-m", "scalelab.orchestrator.backends.watchdog",
               "--driver", str(os.getpid()), "--started", repr(psutil.Process().create_time()),
               "--mark", self.mark, "--dir", str(self.private)]  # fmt: skip
        self.watchdog = subprocess.Popen(
            cmd, env={**os.environ, "PYTHONPATH": driver_pythonpath()},
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            start_new_session=True,  # Ctrl-C and a closed terminal are for the driver only
        )  # fmt: skip

    @contextmanager
    def starting_cluster(self, workers_env: Mapping[str, str] | None = None) -> Iterator[None]:
        """Around `ray.init(address="local")`: what the processes it starts inherit, the
        workers' `workers_env` too. Ray sets RAY_AUTH_MODE=token in this process when it
        turns auth on; that is put back too."""
        ray_auth_log = logging.getLogger(RAY_AUTH_LOGGER)
        ray_auth_log.addFilter(_not_the_opt_out_advice)
        ray_node_log = logging.getLogger(RAY_NODE_LOGGER)  # a spilling config Ray must read
        ray_node_log.addFilter(_not_the_unstable_spilling_advice)
        inherited = {**(workers_env or {}), **SINGLE_NODE, SESSION_VAR: self.mark, **self.auth}
        try:
            with scoped_environ(inherited, (*AUTH_VARS, SPILL_ENV)):
                if spilling_directory():  # given to ray.init as its directory (ray_init)
                    del os.environ[SPILL_ENV]
                yield
        finally:
            ray_auth_log.removeFilter(_not_the_opt_out_advice)
            ray_node_log.removeFilter(_not_the_unstable_spilling_advice)

    def end_clusters(self) -> int:
        """Stop what is left of this driver's clusters (after ray.shutdown); how many."""
        return end_clusters(self.mark, str(self.private))


_session: DriverSession | None = None


def driver_session() -> DriverSession:
    """This process's session, started with its first embedded cluster."""
    global _session
    if _session is None:
        _session = DriverSession()
    return _session


def end_embedded_clusters() -> None:
    """Stop what is left of the clusters this process started, if it started any."""
    if _session is not None:
        _session.end_clusters()
