"""The embedded Ray's watchdog: a small process that ends the clusters a driver started once
the driver is gone, however it went (`kill -9` included).

    python -m scalelab.orchestrator.backends.watchdog --driver PID --started T --mark ID --dir DIR

It waits for the driver to exit, then stops every process of its clusters (the GCS, raylet,
agents, workers, and what trials started under them): SIGTERM, then SIGKILL after a grace
period. Ray's own fate sharing is not enough: the GCS and raylet die with the driver, but the
dashboard and runtime-env agents then wait up to 60 s for the dead GCS before they exit, still
listening. Last, it removes DIR, the driver's private folder (its token, Ray's temp dir with
the clusters' sessions, logs and sockets: a trial's own output is in its trial folder). Only
psutil and the standard library, so it starts in ~0.1 s.

A process is of the clusters when its environment carries SCALELAB_RAY_SESSION=ID, or when
it holds a file open under DIR (their logs): Ray's agents overwrite their environment block
with their process title, and a trial's subprocesses write to their worker's log files.
"""

from __future__ import annotations

import argparse
import os
import select
import shutil
import signal
from contextlib import suppress
from pathlib import Path

import psutil

SESSION_VAR = "SCALELAB_RAY_SESSION"
PRIVATE_PREFIX = "scalelab-ray-"  # of the driver's private folder (tempfile.mkdtemp)
GRACE_S = 3.0  # from SIGTERM to SIGKILL: a torchrun trial gets to write its checkpoint
ROUNDS = 5  # sweeps, for processes started while the previous ones were being stopped


def cluster_processes(mark: str, directory: str) -> list[psutil.Process]:
    """This user's processes of the clusters (other users' processes cannot be read)."""
    inside = os.path.join(os.path.realpath(directory), "")
    found = []
    for proc in psutil.process_iter():
        if proc.pid == os.getpid():
            continue
        with suppress(psutil.Error):
            if proc.environ().get(SESSION_VAR) == mark or any(
                f.path.startswith(inside) for f in proc.open_files()
            ):
                found.append(proc)
    return found


def end_clusters(mark: str, directory: str, grace_s: float = GRACE_S) -> int:
    """Stop every process of the clusters; returns how many there were."""
    ended = 0
    for _ in range(ROUNDS):
        procs = cluster_processes(mark, directory)
        if not procs:
            break
        ended += len(procs)
        for proc in procs:
            with suppress(psutil.Error):
                proc.terminate()
        _, alive = psutil.wait_procs(procs, timeout=grace_s)
        for proc in alive:
            with suppress(psutil.Error):
                proc.kill()
        psutil.wait_procs(alive, timeout=grace_s)
    return ended


def wait_for_exit(pid: int, started: float) -> None:
    """Return once the process `pid` created at `started` has exited."""
    try:
        driver = psutil.Process(pid)
        if driver.create_time() != started:
            return  # gone already, its pid reused
    except psutil.NoSuchProcess:
        return
    pidfd = None
    with suppress(AttributeError, OSError):  # pidfd: Linux >= 5.3; else poll every second
        pidfd = os.pidfd_open(pid)
    while driver.is_running():  # is_running() also notices a reused pid
        if pidfd is None:
            select.select([], [], [], 1.0)
        elif select.select([pidfd], [], [], None)[0]:  # readable once the driver has exited
            return


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--driver", type=int, required=True, help="the driver's pid")
    parser.add_argument("--started", type=float, required=True, help="the driver's create time")
    parser.add_argument("--mark", required=True, help=f"the value of {SESSION_VAR}")
    parser.add_argument("--dir", required=True, help="the driver's private folder")
    args = parser.parse_args(argv)
    for sig in (signal.SIGINT, signal.SIGHUP):  # a closed terminal must not stop the cleanup
        signal.signal(sig, signal.SIG_IGN)
    wait_for_exit(args.driver, args.started)
    end_clusters(args.mark, args.dir)
    if Path(args.dir).name.startswith(PRIVATE_PREFIX):  # never a folder it was not made for
        shutil.rmtree(args.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
