"""scripts/gpu-acceptance.sh --cpu, as CI runs it: one command, a JSON and a Markdown
summary, every check with a goal and a status, and nothing claimed for a GPU not present."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu-acceptance.sh"


@pytest.mark.slow
def test_the_cpu_path_runs_and_summarises_every_check(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("SCALELAB_HOME", "RANK", "WORLD_SIZE")}
    proc = subprocess.run(
        ["bash", str(SCRIPT), "--cpu", "--out", str(tmp_path)],
        capture_output=True, text=True, env=env, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((tmp_path / "acceptance.json").read_text())
    checks = {c["name"]: c for c in summary["checks"]}
    assert summary["mode"] == "cpu"
    assert checks["loss bf16 vs fp32"]["status"] == "pass"
    assert checks["GPU tests"]["status"] == "skipped"  # no GPU numbers on the CPU path
    assert all(
        c["goal"] and c["status"] in ("pass", "skipped", "not built") for c in checks.values()
    )
    table = (tmp_path / "acceptance.md").read_text()
    assert all(name in table for name in checks)


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
