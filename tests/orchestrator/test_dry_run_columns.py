"""A CPU sweep's dry-run shows what a CPU user needs (host RAM, time, CPU-hours, checkpoint
size) and leaves out what only means something on a GPU (memory per GPU, whether it fits
the GPU): the demo's plan fits 120 columns, as one table, not folded into parts. A sweep on
GPUs keeps the GPU columns; --json keeps every number either way."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

DEMO = Path(__file__).resolve().parents[2] / "sweeps" / "demo.yaml"
GPU_COLUMNS = ("GiB/GPU", "fits", "FLOPs")
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def _dry_run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, **OFFLINE, "SCALELAB_HOME": str(tmp_path / "home"), "COLUMNS": "120"}
    env.pop("MLFLOW_TRACKING_URI", None)
    command = [sys.executable, "-m", "scalelab.cli.main", "submit", str(DEMO), *args, "--dry-run"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done


def _headers(out: str, parts: int | None = None) -> list[str]:
    """The table's column headers, over the parts it was folded into (`parts`: how many)."""
    lines = [row for row in out.splitlines() if row.startswith("┃ trial_id")]
    assert parts is None or len(lines) == parts, out
    return [cell.strip() for line in lines for cell in line.strip("┃").split("┃")]


def test_the_demos_dry_run_fits_120_columns_without_gpu_columns(tmp_path):
    out = _dry_run(tmp_path).stdout
    assert max(len(line) for line in out.splitlines()) <= 120, out
    headers = _headers(out, parts=1)  # one table: not folded into parts
    assert not set(GPU_COLUMNS) & set(headers), headers
    for needed in ("trial_id", "params", "tokens", "CPU-h", "status", "data", "wall",
                   "GiB/node", "ckpt GB"):  # fmt: skip
        assert needed in headers, headers
    assert "GPU" not in " ".join(headers)
    assert "no GPUs (host RAM per node shown)" in " ".join(out.split())


def test_a_gpu_sweeps_dry_run_keeps_the_gpu_columns_and_json_every_field(tmp_path):
    out = _dry_run(tmp_path, "backend.gpus_per_trial=1").stdout
    headers = _headers(out)  # folded at 120 columns: wider
    assert set(GPU_COLUMNS) <= set(headers) and "GPU-h" in headers, headers
    plan = json.loads(_dry_run(tmp_path, "--json").stdout)  # the CPU demo: every number
    fields = plan["trials"][0]["plan"]
    assert {"peak_gpu_bytes", "fits", "wall_s", "host_bytes_per_node", "checkpoint_bytes"} <= set(
        fields
    )
    assert plan["trials"][0]["flops"] > 0
