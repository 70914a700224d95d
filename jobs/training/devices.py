"""Which device each rank uses, and whether this node has what the trial's placement asked
for (contract/placement.py): checked before any rendezvous can hang.

A trial asked for GPUs (`slurm.gpus_per_node`, `gpus_per_trial`, or a `backend.gpu` on
SLURM) refuses to start without them (EnvironmentRefused, exit EXIT_REFUSED), naming what
it found: a CPU-only torch, a driver too old for this torch's CUDA, or fewer devices than
asked. Without that, a CPU torch on a GPU node (a venv made on a login node) or a CUDA 13
torch on an older driver trained on the CPU, at a thousandth of the speed.

One rank per GPU: the rank's device is cuda:<local rank> when the node's GPUs are all
visible to every rank, cuda:0 where SLURM binds one GPU to each task (`--gpus-per-task=1`,
`--gpu-bind=single:1`: CUDA_VISIBLE_DEVICES holds that task's GPU only).
"""

from __future__ import annotations

import os
import sys

import torch

from scalelab.contract.outcome import EnvironmentRefused
from scalelab.contract.placement import DeviceAsk
from scalelab.jobs import cuda_builds
from scalelab.jobs.gpus import device_gpu, gpu_spec

REINSTALL = "SCALELAB_TORCH=cuda scripts/bootstrap.sh (docs/running-on-slurm.md, 'The environment on the nodes')"


def gpus_on_node(ask: DeviceAsk) -> int:
    """GPUs this node gives the trial: the placement's count, else SLURM's (SLURM_GPUS_ON_NODE,
    set where GPUs are allocated as GRES); 0 when neither says."""
    slurm = os.environ.get("SLURM_GPUS_ON_NODE", "")
    return ask.gpus_per_node or (int(slurm) if slurm.isdigit() else 0)


def device_index(visible: int, local_rank: int, local_world: int, on_node: int) -> int | None:
    """The CUDA device of a rank: its local rank when it sees every GPU of the node, 0 when
    it sees one and the node has a GPU per rank (bound per task); None: no device for it."""
    if local_rank < visible and visible >= local_world:
        return local_rank
    if visible == 1 and on_node >= local_world:
        return 0
    return None


def rank_device(local_rank: int, local_world: int) -> str:
    """'cuda:<i>' or 'cpu' for this rank (before the checks: check_devices refuses a rank
    left without a GPU)."""
    if not torch.cuda.is_available():
        return "cpu"
    on_node = gpus_on_node(DeviceAsk.from_environ())
    index = device_index(torch.cuda.device_count(), local_rank, local_world, on_node)
    return f"cuda:{local_rank if index is None else index}"


def cuda_problem() -> str | None:
    """Why CUDA cannot be used in this process, in words; None when it can."""
    if torch.version.cuda is None:
        return (
            f"this torch ({torch.__version__}) is a CPU-only build: install the CUDA build "
            f"on a node with the cluster's driver, or from a login node: {REINSTALL}"
        )
    if torch.cuda.is_available():
        return None
    try:  # torch says why (no driver, a driver too old, no device) only when initialising
        torch.cuda.init()
        detail = "torch.cuda.is_available() is False"
    except Exception as e:
        detail = " ".join(str(e).split()) or type(e).__name__
    driver, needs = cuda_builds.driver_version(), cuda_builds.min_driver(torch.version.cuda)
    too_old = "too old" in detail
    if driver and needs:
        try:
            too_old = too_old or cuda_builds.parse_driver(driver) < needs
        except ValueError:
            pass
    if too_old:
        fits = _build_for(driver)
        return (
            f"the NVIDIA driver ({driver or 'version unknown'}) is too old for this torch "
            f"({torch.__version__}, CUDA {torch.version.cuda}"
            + (f", which needs a driver >= {cuda_builds.show(needs)}" if needs else "")
            + f"); reinstall torch for the driver: SCALELAB_CUDA={fits} {REINSTALL} "
            f"(torch said: {detail})"
        )
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return (
        f"CUDA is not available: {detail} (driver {driver or 'none: nvidia-smi does not answer'}"
        + (f", CUDA_VISIBLE_DEVICES={visible!r}" if visible is not None else "")
        + ")"
    )


def _build_for(driver: str | None) -> str:
    try:
        return cuda_builds.choose_build(driver) if driver else "cu126"
    except ValueError:
        return "cu126"


def check_devices(device: str, local_rank: int, local_world: int) -> None:
    """Refuse (EnvironmentRefused) a node without what the placement asked, and more ranks
    on this node than its devices (before any rendezvous can hang)."""
    ask = DeviceAsk.from_environ()
    if ask.wants_cuda and not device.startswith("cuda"):
        asked = f"{ask.gpus_per_node} GPU(s) per node" if ask.gpus_per_node else f"a {ask.gpu}"
        raise EnvironmentRefused(
            f"the trial's placement asks for {asked} but {cuda_problem() or 'this rank runs on the CPU'}"
        )
    if not device.startswith("cuda"):
        have = os.cpu_count() or 1
        if local_world > have:
            raise EnvironmentRefused(
                f"{local_world} ranks on this node but only {have} CPU cores; start at most "
                f"{have} processes per node"
            )
        return
    visible, on_node = torch.cuda.device_count(), gpus_on_node(ask)
    if device_index(visible, local_rank, local_world, on_node) is None:
        raise EnvironmentRefused(
            f"{local_world} ranks on this node but {visible} CUDA device(s) visible to rank "
            f"{local_rank} (CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}"
            + (f", {on_node} asked per node" if on_node else "")
            + "); one rank per GPU: start at most as many processes per node as GPUs"
        )
    bound = visible == 1 and local_world > 1  # one GPU per task (checked above)
    if ask.gpus_per_node and not bound and visible < ask.gpus_per_node:
        raise EnvironmentRefused(
            f"{visible} CUDA device(s) visible, {ask.gpus_per_node} asked per node "
            f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r})"
        )
    _warn_other_gpu(ask, device)


def _warn_other_gpu(ask: DeviceAsk, device: str) -> None:
    """A GPU other than the one the plan assumed: its memory and time checks do not hold."""
    if ask.gpu is None:
        return
    name = torch.cuda.get_device_name(device)
    found = device_gpu(name)
    if found is None or found.name != gpu_spec(ask.gpu).name:
        print(
            f"[scalelab] warning: this node's GPU is {name!r}, the sweep planned for "
            f"{ask.gpu} (backend.gpu): its memory and time estimates do not hold here",
            file=sys.stderr,
        )


def check_node(local_world: int) -> None:
    """check_devices for `local_world` ranks about to start on this node (jobs/launch.py)."""
    check_devices(rank_device(0, local_world), 0, local_world)
