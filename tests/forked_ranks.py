"""Test workers on several gloo ranks, started in milliseconds instead of ~25 s of CPU each.

A fresh rank process imports torch, DeepSpeed (which imports MLflow for its autotuner) and,
at its first ZeRO engine, torch's compiler stack (DeepSpeed imports its Muon optimizer,
whose `torch.compile` decorators import torch._inductor; a meta-device model build imports
torch._dynamo): ~25 s of CPU on the CI machine, paid by every rank of every launch. Here
the ranks are forked from one multiprocessing forkserver per test process that has made
those imports once (PRELOAD). They are still separate processes meeting over gloo on
127.0.0.1 and running real DeepSpeed; only the interpreter's start-up is shared. The
launcher's own path (jobs/training/local_ranks.py, `python -m scalelab.jobs.training.train`) keeps its tests
(tests/faults/test_rank_listeners.py, tests/orchestrator/test_end_to_end.py).
"""

from __future__ import annotations

import importlib.util
import multiprocessing
import os
import socket
import time
from pathlib import Path
from typing import Any

# What a rank would import anyway; a module missing here is skipped by the forkserver.
PRELOAD = [
    "scalelab.jobs.training.train",
    "deepspeed",
    "deepspeed.runtime.zero.muon.muon_optimizer",
]
LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "SLURM_PROCID")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _context() -> multiprocessing.context.BaseContext:
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)  # read when the server starts (the first call)
    return ctx


def _rank_main(worker: str, function: str, args: tuple, environ: dict[str, str]) -> None:
    """In the rank: the test's environment (the forkserver's is the one it started with),
    then `function` of the worker file."""
    os.environ.clear()
    os.environ.update(environ)
    spec = importlib.util.spec_from_file_location(Path(worker).stem, worker)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    getattr(module, function)(*args)


def on_ranks(worker: Path, function: str, *args: Any, ranks: int = 2,
             env: dict[str, str] | None = None, timeout_s: float = 400) -> None:  # fmt: skip
    """Run `function(*args)` of the file `worker` on `ranks` processes that form one
    process group through env:// (RANK, WORLD_SIZE, MASTER_ADDR/PORT set as torchrun
    would). Fails the test if a rank fails or the ranks outlast `timeout_s`; the ranks'
    output goes to this process's (captured) stderr."""
    base = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS}
    base |= {"OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
             **(env or {})}  # fmt: skip
    ctx = _context()
    launch = {"WORLD_SIZE": str(ranks), "LOCAL_WORLD_SIZE": str(ranks)}
    procs = [
        ctx.Process(
            target=_rank_main,
            args=(
                str(worker),
                function,
                args,
                base | launch | {"RANK": str(r), "LOCAL_RANK": str(r)},
            ),
        )
        for r in range(ranks)
    ]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout_s
    try:
        while any(p.exitcode is None for p in procs) and time.monotonic() < deadline:
            if any(p.exitcode not in (None, 0) for p in procs):
                break  # the others would wait for it in a collective
            time.sleep(0.1)
    finally:
        for p in procs:
            if p.exitcode is None:
                p.kill()
            p.join()
    codes = [p.exitcode for p in procs]
    assert codes == [0] * ranks, (
        f"rank exit codes {codes} (-9: stopped here, at the timeout or once another rank failed)"
    )
