"""Several ranks of one trial on this machine, with nothing listening beyond 127.0.0.1
(docs/reliability.md, "What listens where").

torchrun's rendezvous store (torch's TCPStore) listens on every interface and takes no
bind address, but it can serve from a socket that is already listening
(`master_listen_fd`). So this launcher binds 127.0.0.1 itself, serves the store from that
socket, and starts the ranks as its clients (TORCHELASTIC_USE_AGENT_STORE: rank 0 does not
start a store of its own, as under torchrun). Each rank then pins gloo's and NCCL's sockets
to the loopback interface (jobs/training/distributed.py, read_environment).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import IO

LOOPBACK = "127.0.0.1"
STOP_GRACE_S = 30.0  # a rank told to stop writes its checkpoint first (jobs/training/checkpoint.py)


def rank_environment(rank: int, ranks: int, port: int) -> dict[str, str]:
    """What torch.distributed's env:// and DeepSpeed read, as torchrun would set it."""
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")  # torchrun's default with several ranks
    env.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(ranks),
        LOCAL_WORLD_SIZE=str(ranks),
        GROUP_RANK="0",
        MASTER_ADDR=LOOPBACK,
        MASTER_PORT=str(port),
        TORCHELASTIC_USE_AGENT_STORE="True",
        TORCHELASTIC_RESTART_COUNT="0",
    )
    return env


def run_local_ranks(
    command: Sequence[str], ranks: int, outputs: Sequence[IO[bytes] | None] = ()
) -> int:
    """Run `command` as `ranks` processes of one process group; the first non-zero exit
    code (the others are stopped), else 0. Rank r's stdout and stderr go to `outputs[r]`
    (None or missing: this process's). SIGTERM / SIGINT to this process are passed on to
    every rank (a preempted trial checkpoints and exits 75)."""
    import torch.distributed as dist

    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((LOOPBACK, 0))
    listener.listen(ranks * 4)
    port = listener.getsockname()[1]
    # the store owns the socket from here: it closes it when deleted
    store = dist.TCPStore(
        LOOPBACK, port, ranks, is_master=True, master_listen_fd=listener.detach(),
        wait_for_workers=False, timeout=timedelta(minutes=30),
    )  # fmt: skip
    sinks = [outputs[r] if r < len(outputs) else None for r in range(ranks)]
    procs = [
        subprocess.Popen(list(command), env=rank_environment(r, ranks, port), stdout=sink,
                         stderr=None if sink is None else subprocess.STDOUT)
        for r, sink in enumerate(sinks)
    ]  # fmt: skip
    previous = _forward_signals(procs)
    try:
        return _wait(procs)
    finally:
        _stop(procs)
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        del store


def _forward_signals(procs: list[subprocess.Popen]) -> dict[int, object]:
    previous: dict[int, object] = {}

    def forward(signum: int, _frame: object) -> None:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signum)

    try:
        for signum in (signal.SIGTERM, signal.SIGINT):
            previous[signum] = signal.signal(signum, forward)
    except ValueError:  # not the main thread (a Ray task's thread): nothing to forward
        pass
    return previous


def _wait(procs: list[subprocess.Popen]) -> int:
    while True:
        codes = [p.poll() for p in procs]
        failed = [c for c in codes if c not in (None, 0)]
        if failed:
            return failed[0]
        if all(c == 0 for c in codes):
            return 0
        time.sleep(0.2)


def _stop(procs: list[subprocess.Popen]) -> None:
    """What still runs gets SIGTERM (its checkpoint), then SIGKILL after the grace."""
    live = [p for p in procs if p.poll() is None]
    for p in live:
        p.terminate()
    deadline = time.monotonic() + STOP_GRACE_S
    for p in live:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
