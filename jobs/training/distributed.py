"""Distributed set-up from whichever launcher started this process. Nothing else reads
the launcher's environment.

Launchers understood (checked in this order):
- an already initialised process group (a Ray Train worker group, a test harness): used
  as is and left for its owner to destroy;
- torchrun and the `deepspeed` launcher: RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR,
  inside a SLURM task only where a launcher in the task set them (jobs/training/slurm_task.py:
  a pair the task inherited from the submitting shell is not this job's);
- submitit / SLURM (SLURM_PROCID, SLURM_NTASKS, ...): submitit's
  TorchDistributedEnvironment gives the rendezvous (the job's first node, a port drawn from
  the job id, below the ephemeral ports, unless set inside the job), exported over what
  the job inherited;
- a Ray Train worker that has not initialised torch.distributed: its train context;
- nothing: one process, rendezvous on 127.0.0.1 and a free port.
"""

from __future__ import annotations

import os
import socket
import sys
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from scalelab.jobs.training import devices, slurm_task


@dataclass(frozen=True)
class DistEnv:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str
    master_port: int
    launcher: str  # 'none' | 'env' (torchrun, deepspeed) | 'slurm' | 'ray' | 'external'
    device: str  # 'cuda:<local_rank>' or 'cpu'
    owns_process_group: bool  # False when someone else initialised torch.distributed
    exported: tuple[str, ...] = ()  # variables we added to os.environ (removed at shutdown)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def backend(self) -> str:
        return "nccl" if self.device.startswith("cuda") else "gloo"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ray_train_context() -> tuple[int, int, int, int] | None:
    if "ray" not in sys.modules:  # never import Ray just to find out it is not there
        return None
    try:
        from ray import train

        ctx = train.get_context()
        return (
            ctx.get_world_rank(),
            ctx.get_world_size(),
            ctx.get_local_rank(),
            ctx.get_local_world_size(),
        )
    except Exception:
        return None


def read_environment() -> DistEnv:
    """Rank, world size, local rank and rendezvous address of this process (and export
    the rendezvous variables torch.distributed's env:// method and DeepSpeed expect)."""
    env = os.environ
    before = set(env)
    peer = None  # another node of the job, where the launcher names them
    cuda = torch.cuda.is_available()
    if dist.is_available() and dist.is_initialized():
        rank, world = dist.get_rank(), dist.get_world_size()
        local = int(env.get("LOCAL_RANK", rank))
        local_world = int(env.get("LOCAL_WORLD_SIZE", world))
        launcher, owns = "external", False
    elif slurm_task.rank_from_launcher(env):
        rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
        local = int(env.get("LOCAL_RANK", 0))
        local_world = int(env.get("LOCAL_WORLD_SIZE", world))
        launcher, owns = "env", True
    elif slurm_task.in_task(env):
        if "RANK" in env:
            print(f"[scalelab] RANK={env['RANK']} WORLD_SIZE={env.get('WORLD_SIZE')} from the "
                  f"submitting environment ignored: this is SLURM task {env['SLURM_PROCID']} "
                  f"of {env['SLURM_NTASKS']}", file=sys.stderr)  # fmt: skip
        tde = _slurm_rendezvous()
        peer = _peer_node()
        rank, world = tde.rank, tde.world_size
        local, local_world = tde.local_rank, tde.local_world_size
        launcher, owns = "slurm", True
    elif (ray_ctx := _ray_train_context()) is not None:
        rank, world, local, local_world = ray_ctx
        env.setdefault("MASTER_ADDR", "127.0.0.1")  # single node: Ray's own IP can fail
        launcher, owns = "ray", True
    else:
        rank, world, local, local_world = 0, 1, 0, 1
        env.setdefault("MASTER_ADDR", "127.0.0.1")
        env.setdefault("MASTER_PORT", str(_free_port()))
        launcher, owns = "none", True
    env.setdefault("MASTER_ADDR", "127.0.0.1")
    env.setdefault("MASTER_PORT", "29500")
    if world == local_world and (lo := _loopback_interface()):  # every rank on this machine
        # gloo and NCCL listen on the address the host name resolves to, often the network's
        env.setdefault("GLOO_SOCKET_IFNAME", lo)
        env.setdefault("NCCL_SOCKET_IFNAME", lo)
    elif world > local_world and "GLOO_SOCKET_IFNAME" not in env:
        # several nodes: gloo (the preemption vote's group; all of a CPU job) would listen on
        # the address the host name resolves to, which need not reach the other nodes (on
        # the first node, often 127.0.1.1): the interface that routes to another node
        toward = peer or env["MASTER_ADDR"]
        if iface := route_interface(toward):
            env["GLOO_SOCKET_IFNAME"] = iface
        if local == 0:
            print(f"[scalelab] rank {rank}: gloo on interface {iface or 'of the host name'} "
                  f"(routes to {toward})", file=sys.stderr)  # fmt: skip
    device = devices.rank_device(local, local_world) if cuda else "cpu"
    for key, value in (
        ("RANK", rank),
        ("WORLD_SIZE", world),
        # DeepSpeed reads LOCAL_RANK as the rank's CUDA device: 0 where a task sees one GPU
        ("LOCAL_RANK", device.partition(":")[2] or local),
        ("LOCAL_WORLD_SIZE", local_world),
    ):
        env[key] = str(value)  # DeepSpeed looks for these (else it tries mpi4py)
    return DistEnv(
        rank=rank,
        world_size=world,
        local_rank=local,
        local_world_size=local_world,
        master_addr=env["MASTER_ADDR"],
        master_port=int(env["MASTER_PORT"]),
        launcher=launcher,
        device=device,
        owns_process_group=owns,
        exported=tuple(sorted(set(env) - before)),
    )


# The rendezvous port of a SLURM job, drawn from its id below Linux's ephemeral range
# (32768-60999 by default): submitit draws from 20000-60000, where a port the kernel lent
# an outgoing connection on the first node made rank 0's store fail (EADDRINUSE).
SLURM_PORTS = range(20000, 32768)


def slurm_port(job_id: str) -> int:
    """The same port for every task of a job and for its requeued runs."""
    digits = "".join(c for c in job_id if c.isdigit()) or "0"  # 123_4 for an array task
    return SLURM_PORTS[int(digits) % len(SLURM_PORTS)]


def _slurm_rendezvous() -> Any:
    """submitit's view of the SLURM job, its variables exported. What the job inherited
    from the submitting shell (sbatch passes the environment on) is replaced: an inherited
    MASTER_ADDR names the submitting host, not the job's first node (submitit refuses to
    export over it); an inherited MASTER_PORT is the same for every job of a sweep (two
    on one node collide) or an earlier run's: the port is `slurm_port`'s unless set inside
    the job (submitit reads it)."""
    from submitit.helpers import TorchDistributedEnvironment

    port = str(slurm_port(os.environ.get("SLURM_JOB_ID", "0")))
    if slurm_task.inherited(os.environ, "MASTER_PORT") and os.environ["MASTER_PORT"] != port:
        print(f"[scalelab] MASTER_PORT={os.environ['MASTER_PORT']} from the submitting "
              f"environment replaced by the job's port {port}", file=sys.stderr)  # fmt: skip
        os.environ["MASTER_PORT"] = port
    os.environ.setdefault("MASTER_PORT", port)
    tde = TorchDistributedEnvironment()
    inherited = os.environ.get("MASTER_ADDR")
    if inherited not in (None, tde.master_addr):
        print(f"[scalelab] MASTER_ADDR={inherited} from the submitting environment replaced "
              f"by the job's first node {tde.master_addr}", file=sys.stderr)  # fmt: skip
    return tde.export(set_cuda_visible_devices=False, overwrite=True)


def _peer_node() -> str | None:
    """Another node of this SLURM job: the first, or from the first node the second."""
    import submitit

    job = submitit.JobEnvironment()
    names = job.hostnames
    if len(names) < 2:
        return None
    return names[1] if job.node == 0 else names[0]


def _loopback_interface() -> str | None:
    names = [name for _, name in socket.if_nameindex()]
    return next((n for n in ("lo", "lo0") if n in names), None)


def route_interface(host: str) -> str | None:
    """The network interface this machine reaches `host` through (the one holding the source
    address the kernel picks for it); None when it cannot be told."""
    import psutil

    try:
        family, _, _, _, address = socket.getaddrinfo(host, 9, type=socket.SOCK_DGRAM)[0]
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect(address)  # UDP: no packet is sent, only the route is looked up
            source = probe.getsockname()[0]
    except OSError:
        return None
    for name, addresses in psutil.net_if_addrs().items():
        if any(a.address.split("%")[0] == source for a in addresses):
            return name
    return None


def check_devices(env: DistEnv) -> None:
    """Refuse a node without the devices the trial's placement asked for, and more ranks per
    node than devices (jobs/training/devices.py; before any rendezvous can hang)."""
    devices.check_devices(env.device, env.local_rank, env.local_world_size)


def init(env: DistEnv, timeout_minutes: float | None = None) -> None:
    """Initialise torch.distributed (gloo on CPU, nccl on CUDA) and DeepSpeed's comm layer;
    `timeout_minutes`: how long a collective may wait for a rank (deepspeed.dist_timeout_minutes;
    None: torch's default). A group someone else started keeps its own."""
    timeout = None if timeout_minutes is None else timedelta(minutes=timeout_minutes)
    if not env.device.startswith("cuda"):
        # Name the accelerator: DeepSpeed's auto-detection warns on every CPU process.
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
        # One thread per rank: with several ranks sharing cores, more threads make steps
        # ~4x slower and erratic (measured on the CI machine).
        if "OMP_NUM_THREADS" not in os.environ:
            os.environ["OMP_NUM_THREADS"] = "1"
            torch.set_num_threads(1)
        _skip_shm_comm_build()
    else:
        torch.cuda.set_device(env.device)
    if env.owns_process_group and not dist.is_initialized():
        # A world of one has no one to meet: an in-process store, not env://'s TCPStore,
        # which listens on every interface whatever MASTER_ADDR says.
        store = dist.HashStore() if env.world_size == 1 else None
        dist.init_process_group(backend=env.backend, store=store, rank=env.rank,
                                world_size=env.world_size, timeout=timeout)  # fmt: skip
    import deepspeed

    if timeout is None:
        deepspeed.init_distributed(dist_backend=env.backend)
    else:
        deepspeed.init_distributed(dist_backend=env.backend, timeout=timeout)


def _skip_shm_comm_build() -> None:
    """DeepSpeed's CPU accelerator JIT-builds its `deepspeed_shm_comm` op for every new
    process group on a fresh machine (35-50 s). Gloo's all-reduce is enough for CPU runs, so
    mark the op unavailable; DeepSpeed keeps this probe result in one module-level dict."""
    import deepspeed.ops

    if os.environ.get("SCALELAB_DS_SHM_COMM") != "1":
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False


def barrier(env: DistEnv) -> None:
    if env.world_size > 1 and dist.is_initialized():
        dist.barrier()


def shutdown(env: DistEnv) -> None:
    """Barrier, then destroy the group we created (without this, ~7% of runs under the
    deepspeed launcher abort at exit), and forget the rendezvous variables we invented so
    a later job or child process does not mistake them for a launcher's."""
    for key in env.exported:
        os.environ.pop(key, None)
    _restore_torch_linear()
    if not dist.is_initialized():
        return
    dist.barrier()
    if env.owns_process_group:
        dist.destroy_process_group()
        _forget_deepspeed_groups()


def _restore_torch_linear() -> None:
    """A ZeRO-3 engine replaces torch.nn.functional.linear for the whole process with its
    memory-saving version ("This will persist unless manually reset":
    deepspeed/runtime/zero/partition_parameters.py), whose gradients differ in the last
    bits; a later trial in this process (a reused Ray worker, tests) would then train
    differently from the same trial in a fresh one. Put torch's own back."""
    patcher = sys.modules.get("deepspeed.runtime.zero.partition_parameters")
    original = getattr(getattr(patcher, "InsertPostInitMethodToModuleSubClasses", None),
                       "linear_bk", None)  # fmt: skip
    if original is not None:
        torch.nn.functional.linear = original


def _forget_deepspeed_groups() -> None:
    """DeepSpeed caches sub-groups of the world group in module globals; after the world
    group is destroyed they are dead handles, so a second job in this process (tests, a
    long-lived worker) would fail on them. Reset them to their import-time empties."""
    from deepspeed.utils import groups

    for name, value in list(vars(groups).items()):
        if not (name.startswith("_") and name[1:].isupper()):
            continue
        if isinstance(value, dict):
            value.clear()
        elif isinstance(value, dist.ProcessGroup):
            setattr(groups, name, None)
