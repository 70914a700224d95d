"""A trial whose placement asks for GPUs refuses a node without them (jobs/training/devices.py),
naming what it found; which device each rank uses, also where SLURM binds one GPU per task;
which CUDA build of torch a driver runs (jobs/cuda_builds.py, scripts/bootstrap.sh)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from scalelab.contract.placement import DeviceAsk
from scalelab.contract.workdir import RESULT_FILE
from scalelab.jobs import cuda_builds
from scalelab.jobs.launch import DEFAULT_JOB, launch
from scalelab.jobs.training import devices

ROOT = Path(__file__).resolve().parents[2]
BASH = shutil.which("bash") or "bash"
needs_no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is here")


@needs_no_cuda
@pytest.mark.parametrize("ranks", [1, 2])
def test_a_trial_asked_for_gpus_refuses_this_cpu_node_and_says_why(home, tiny_job, ranks):
    """CUDA is truly absent here: the job used to train on the CPU instead."""
    job = tiny_job()
    out = launch(DEFAULT_JOB, job.model_dump_json(), None, ranks, ask=DeviceAsk(ranks))
    assert out["status"] == "FAILED" and out["refused"], out
    assert f"asks for {ranks} GPU(s) per node" in out["reason"]
    assert "is a CPU-only build" in out["reason"] and "SCALELAB_TORCH=cuda" in out["reason"]
    assert not (home / "trials" / job.trial_id / RESULT_FILE).exists()  # nothing trained
    log = (home / "trials" / job.trial_id / "logs" / "trial.log").read_text()
    assert "[scalelab] refused: the trial's placement asks for" in log
    assert os.environ.get("SCALELAB_GPUS_PER_NODE") is None  # the ask ends with the trial


@needs_no_cuda
def test_a_sweep_naming_its_gpu_model_refuses_a_cpu_node_too(home, tiny_job):
    out = launch(DEFAULT_JOB, tiny_job().model_dump_json(), None, ask=DeviceAsk(gpu="H100 SXM"))
    assert out["refused"] and "asks for a H100 SXM but this torch" in out["reason"]


def _fake_nvidia_smi(tmp_path: Path, driver: str) -> str:
    """A real `nvidia-smi` process on PATH that reports `driver`."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    smi.write_text(
        f"#!/bin/sh\ncase \"$*\" in *-L*) echo 'GPU 0: fake';; *) echo {driver};; esac\n"
    )
    smi.chmod(0o755)
    return f"{bin_dir}{os.pathsep}{os.environ['PATH']}"


def test_a_driver_too_old_for_the_torch_build_is_named_with_the_build_to_install(
    tmp_path, monkeypatch
):
    """A CUDA 13 torch on a 550 driver (forced: this machine has no CUDA torch)."""
    monkeypatch.setenv("PATH", _fake_nvidia_smi(tmp_path, "550.54.15"))
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)

    def init() -> None:
        raise RuntimeError("The NVIDIA driver on your system is too old (found version 12040).")

    monkeypatch.setattr(torch.cuda, "init", init)
    why = devices.cuda_problem()
    assert "the NVIDIA driver (550.54.15) is too old for this torch" in why
    assert "CUDA 13.0, which needs a driver >= 580.0" in why
    assert "SCALELAB_CUDA=cu126 SCALELAB_TORCH=cuda scripts/bootstrap.sh" in why


@pytest.mark.parametrize(
    ("visible", "local_rank", "local_world", "on_node", "index"),
    [
        (8, 3, 8, 8, 3),  # every task sees the node's 8 GPUs
        (1, 3, 8, 8, 0),  # --gpus-per-task=1 / --gpu-bind: each task sees its own
        (1, 0, 1, 1, 0),  # one rank, one GPU
        (1, 1, 2, 1, None),  # two ranks sharing one GPU
        (1, 1, 2, 0, None),  # one GPU visible and nobody says the node has more
        (4, 5, 8, 8, None),  # half the node's GPUs visible to every task
    ],
)
def test_the_device_of_each_rank(visible, local_rank, local_world, on_node, index):
    assert devices.device_index(visible, local_rank, local_world, on_node) == index


@pytest.mark.parametrize(
    ("driver", "build"),
    [("580.65.06", "cu130"), ("575.51.03", "cu128"), ("570.26", "cu128"),
     ("560.35.03", "cu126"), ("525.60.13", "cu126")],
)  # fmt: skip
def test_the_cuda_build_a_driver_runs(driver, build):
    assert cuda_builds.choose_build(driver) == build


def test_a_driver_older_than_cuda_12_needs_is_refused():
    with pytest.raises(ValueError, match=r"470.82.01 is too old .*CUDA 12 needs >= 525.60"):
        cuda_builds.choose_build("470.82.01")


def _which_torch(env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [BASH, str(ROOT / "scripts" / "bootstrap.sh"), "--which-torch"],
        capture_output=True, text=True, timeout=60,
        env={k: v for k, v in {**os.environ, **env}.items() if not k.startswith("SCALELAB_")
             or k in env},
    )  # fmt: skip


def test_bootstrap_picks_the_cuda_build_the_node_s_driver_runs(tmp_path):
    path = _fake_nvidia_smi(tmp_path, "550.54.15")
    auto = _which_torch({"PATH": path})  # a driver answers: a CUDA build, the one it runs
    assert auto.stdout.strip() == "torch==2.13.0+cu126 from https://download.pytorch.org/whl/cu126"
    chosen = _which_torch({"PATH": path, "SCALELAB_CUDA": "cu130"})
    assert chosen.stdout.strip().startswith("torch==2.13.0+cu130 ")
    old = _which_torch({"PATH": _fake_nvidia_smi(tmp_path, "470.82.01")})
    assert old.returncode == 2 and "470.82.01 is too old" in old.stderr


def test_bootstrap_for_cuda_on_a_login_node_without_a_driver_picks_the_default_build(tmp_path):
    bare = tmp_path / "bare"
    bare.mkdir()
    for tool in ("bash", "sed", "cat", "sha256sum", "cut", "dirname"):
        (bare / tool).symlink_to(shutil.which(tool))
    python = {"SCALELAB_PYTHON": sys.executable}
    made = _which_torch({"PATH": str(bare), "SCALELAB_TORCH": "cuda", **python})  # no nvidia-smi
    assert made.returncode == 0, made.stderr
    assert made.stdout.strip() == f"torch==2.13.0+{cuda_builds.DEFAULT_BUILD} from " \
        f"https://download.pytorch.org/whl/{cuda_builds.DEFAULT_BUILD}"  # fmt: skip
    assert "no NVIDIA driver answers here" in made.stderr
    cpu = _which_torch({"PATH": str(bare), **python})  # auto without a driver: the CPU build
    assert cpu.stdout.strip().startswith("torch==2.13.0+cpu ")


BROKEN_DRIVER = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure "
    "that the latest NVIDIA driver is installed and running."
)


@pytest.mark.parametrize(("said", "code"), [(BROKEN_DRIVER, 9), ("No devices were found", 6)])
def test_bootstrap_says_why_when_nvidia_smi_fails_and_which_torch_it_takes(tmp_path, said, code):
    """nvidia-smi there but failing (a fake one: a broken driver cannot be made here): the CPU
    torch, with nvidia-smi's reason and the choice on stderr; a login node still bootstraps."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\ncat <<'EOF'\n{said}\n\nEOF\nexit {code}\n")
    smi.chmod(0o755)
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "SCALELAB_PYTHON": sys.executable}
    auto = _which_torch(env)
    assert auto.returncode == 0 and auto.stdout.startswith("torch==2.13.0+cpu "), auto.stderr
    (warning,) = auto.stderr.splitlines()
    assert warning.startswith(
        f"warning: nvidia-smi failed (exit {code}: {said}): this installs the CPU torch. "
    )
    assert "SCALELAB_TORCH=cuda installs the CUDA build" in warning
    assert "SCALELAB_TORCH=cpu keeps the CPU one" in warning
    cuda = _which_torch({**env, "SCALELAB_TORCH": "cuda"})
    assert cuda.stdout.startswith(f"torch==2.13.0+{cuda_builds.DEFAULT_BUILD} "), cuda.stderr
    cpu = _which_torch({**env, "SCALELAB_TORCH": "cpu"})  # chosen: nothing to warn about
    assert cpu.stdout.startswith("torch==2.13.0+cpu ") and cpu.stderr == ""


def test_gloo_s_interface_is_the_one_that_routes_to_the_other_node():
    """Several nodes: gloo listens on the interface holding the address this machine reaches
    the other node from (jobs/training/distributed.py), told apart here by this machine's
    own addresses, each reached through its interface."""
    import psutil

    from scalelab.jobs.training.distributed import route_interface

    assert route_interface("127.0.0.1") == "lo"
    assert route_interface("no-such-node.invalid") is None
    for name, addresses in psutil.net_if_addrs().items():
        for a in addresses:
            if a.family == socket.AF_INET and not a.address.startswith("127."):
                assert route_interface(a.address) == name
