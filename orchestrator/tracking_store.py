"""Whether the sweep's trials may write the tracking store they would write (torch-free).

The default store is a sqlite file (`$SCALELAB_HOME/mlflow.db`). On SLURM, and on a Ray
cluster of other machines, rank 0 of every running trial writes it from its own node while
the driver writes it from the login node: sqlite over a shared filesystem (NFS, Lustre,
GPFS) has no locking that holds across hosts, so writes stall on "database is locked" or
corrupt the file. Such a sweep is refused at submit (and by --dry-run), with the command
that starts a tracking server. A server at a loopback address (127.0.0.0/8, ::1, localhost)
is refused the same way: on a compute node that address is the node itself. Where every job
runs on the driver's machine (a one-machine SLURM such as the test cluster),
`backend.allow_file_tracking: true` keeps either.
"""

from __future__ import annotations

import ipaddress
from typing import TYPE_CHECKING
from urllib.parse import urlparse

if TYPE_CHECKING:
    from scalelab.orchestrator.backends.base import BackendOptions

FILE_SCHEMES = {"sqlite", "file", ""}  # MLflow's file-backed stores ('' : a plain path)
SERVER_PORT = 5000


def file_backed(uri: str) -> bool:
    scheme = urlparse(uri).scheme
    return scheme in FILE_SCHEMES or len(scheme) == 1  # 'C:' of a Windows path


def loopback_host(uri: str) -> str | None:
    """The host of `uri` when it is this machine's own (a loopback or unspecified address,
    localhost); None otherwise. Names are not resolved: a name the login node's /etc/hosts
    maps to 127.0.1.1 is the login node's address on the compute nodes."""
    try:
        host = urlparse(uri).hostname or ""
    except ValueError:  # a malformed [IPv6] literal: MLflow says what is wrong with it
        return None
    name = host.rstrip(".")
    if name == "localhost" or name.endswith(".localhost"):
        return host
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return None
    mapped = getattr(address, "ipv4_mapped", None)  # ::ffff:127.0.0.1
    own = address.is_loopback or address.is_unspecified or bool(mapped and mapped.is_loopback)
    return host if own else None


def tracking_refusal(backend: BackendOptions, uri: str) -> str | None:
    """Why this backend may not write the tracking store `uri`; None when it may. Who
    writes it from other machines is the backend's to say (`writers_elsewhere`)."""
    who = backend.writers_elsewhere()
    if who is None or backend.allow_file_tracking:
        return None
    host = loopback_host(uri)
    if host is not None:
        return (
            f"the tracking store {uri} is at {host}, and {who}, where {host} is the node "
            "itself, not this machine: export MLFLOW_TRACKING_URI with the address the nodes "
            "reach the server at (docs/running-on-slurm.md, 'The tracking store on a "
            "cluster') and submit again; or, where every job runs on this machine, set "
            "backend.allow_file_tracking: true"
        )
    if not file_backed(uri):
        return None
    return (
        f"the tracking store {uri} is a file, and {who} while the driver writes it here: "
        "sqlite on a shared filesystem, written from several machines, locks up or corrupts. "
        "Serve it from one machine and point the sweep at the server:\n"
        f"  mlflow server --backend-store-uri {uri} --host 127.0.0.1 --port {SERVER_PORT}\n"
        "then export MLFLOW_TRACKING_URI with the address the nodes reach it at (behind TLS "
        "and a login: docs/running-on-slurm.md, 'The tracking store on a cluster') and submit "
        "again; or, where every job runs on this machine, set backend.allow_file_tracking: true"
    )
