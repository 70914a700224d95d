"""`pytest -m gpu` on tests/kernels: the compiled Triton FWHT against the torch path, in
every dtype and form, at the ladder's widths (the paper presets of models/sizes.py) and one
width of the block family the ladder lacks, 1792 = 28 x 64 (768 and 1536 have a Paley-12
block, 2560 a Paley-20 one, the rest are powers of two). Every supported width would be
~170 tests and as many kernel compiles, past this part's budget; the widths reach the tests
through SCALELAB_GPU_TEST_WIDTHS (tests/kernels/test_triton_gpu.py).

Passes when every test collected ran and passed: a skipped GPU test (no CUDA device in the
subprocess) fails the row rather than passing unseen.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks.acceptance.checks import NO_GPU, Check, verdict
from scalelab.models.sizes import SIZES

REPO = Path(__file__).resolve().parents[2]
LADDER_WIDTHS = tuple(p.d_model for p in SIZES.values() if not p.cpu_sized)
WIDTHS = (*LADDER_WIDTHS, 1792)
WIDTHS_VARIABLE = "SCALELAB_GPU_TEST_WIDTHS"
TIMEOUT_S = 80  # inside the part's budget, so that a slow run still reports its counts
NAME = "GPU tests"
GOAL = (
    "pytest -m gpu tests/kernels passes at widths "
    f"{', '.join(map(str, WIDTHS))}: no test failed or skipped, within {TIMEOUT_S} s"
)
# a test's line in `pytest -v` output: its node id, then its outcome (the -ra summary's
# lines start with the outcome, so they are not counted twice)
OUTCOME = re.compile(r"^\S+::\S+ (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b", re.MULTILINE)


@dataclass(frozen=True)
class Outcomes:
    passed: int = 0
    failed: int = 0  # failures and errors
    skipped: int = 0  # skipped and expected failures


def count(verbose_output: str) -> Outcomes:
    """The outcomes in `pytest -v` output (complete, or cut off by the timeout)."""
    outcomes = OUTCOME.findall(verbose_output)
    return Outcomes(
        passed=sum(o in ("PASSED", "XPASS") for o in outcomes),
        failed=sum(o in ("FAILED", "ERROR") for o in outcomes),
        skipped=sum(o in ("SKIPPED", "XFAIL") for o in outcomes),
    )


def gpu_tests_check(
    counts: Outcomes, returncode: int | None, seconds: float, last_line: str
) -> Check:
    """The verdict of one pytest run (returncode None: stopped at TIMEOUT_S; no torch:
    testable alone)."""
    ok = returncode == 0 and counts.passed > 0 and not counts.failed and not counts.skipped
    ran = "ran past the timeout" if returncode is None else f"exit code {returncode}"
    return Check(
        NAME,
        GOAL,
        verdict(ok),
        f"{counts.passed} passed, {counts.failed} failed, {counts.skipped} skipped in "
        f"{seconds:.0f} s ({ran}; {last_line.strip()[:200]})",
    )


def run(cpu: bool, out: Path) -> list[Check]:
    if cpu:
        return [Check(NAME, GOAL, "skipped", f"{NO_GPU}; pytest -m gpu was not run")]
    env = {**os.environ, WIDTHS_VARIABLE: ",".join(map(str, WIDTHS))}
    command = [sys.executable, "-m", "pytest", "-m", "gpu", "-v", "-p", "no:cacheprovider",
               "tests/kernels"]  # fmt: skip
    start = time.monotonic()
    try:
        proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=TIMEOUT_S)  # fmt: skip
        output, returncode = proc.stdout + proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as e:
        output, returncode = _text(e.stdout) + _text(e.stderr), None
    (out / "gpu-tests.log").write_text(output)
    last = (output.strip().splitlines() or [""])[-1]
    return [gpu_tests_check(count(output), returncode, time.monotonic() - start, last)]


def _text(captured: str | bytes | None) -> str:
    if isinstance(captured, bytes):
        return captured.decode(errors="replace")
    return captured or ""
