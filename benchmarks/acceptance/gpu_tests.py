"""`pytest -m gpu`: the CUDA and Triton tests (the Triton FWHT against a device copy)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from benchmarks.acceptance.checks import NO_GPU, Check, verdict

REPO = Path(__file__).resolve().parents[2]
GOAL = "pytest -m gpu passes (CUDA and Triton tests)"


def run(cpu: bool) -> list[Check]:
    if cpu:
        return [Check("GPU tests", GOAL, "skipped", NO_GPU)]
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "tests/kernels"],
        cwd=REPO, capture_output=True, text=True,
    )  # fmt: skip
    last = (proc.stdout.strip().splitlines() or [""])[-1]
    return [Check("GPU tests", GOAL, verdict(proc.returncode == 0), last)]
