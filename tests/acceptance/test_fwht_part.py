"""The FWHT and GPU-tests parts of the GPU acceptance run (benchmarks/acceptance/fwht.py,
gpu_tests.py): their verdicts on good and bad measurements, the widths they run, and their
CPU paths."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

from benchmarks.acceptance import fwht, gpu_tests
from benchmarks.acceptance.checks import NO_GPU
from benchmarks.acceptance.fwht import Exactness
from benchmarks.acceptance.gpu_tests import Outcomes
from scalelab.models.sizes import SIZES

REPO = Path(__file__).resolve().parents[2]
ROWS_768 = (256 << 20) // (2 * 768)


def test_the_parts_run_the_widths_of_the_sweeps_ladder() -> None:
    sweep = yaml.safe_load((REPO / "sweeps" / "hadamard.yaml").read_text())
    ladder = tuple(SIZES[name].d_model for name in sweep["zip"]["model.size"])
    assert fwht.LADDER_WIDTHS == gpu_tests.LADDER_WIDTHS == ladder
    assert gpu_tests.WIDTHS == (*ladder, 1792)  # and the Paley-28 family, which it lacks


def test_triton_must_stay_within_its_factor_of_a_memory_copy() -> None:
    copy_s = 200e-6
    good = fwht.speed_check(768, ROWS_768, 1.2 * copy_s, copy_s, "H100")
    bad = fwht.speed_check(768, ROWS_768, 2.0 * copy_s, copy_s, "H100")
    edge = fwht.speed_check(768, ROWS_768, fwht.COPY_FACTOR * copy_s, copy_s, "H100")
    assert (good.status, bad.status, edge.status) == ("pass", "fail", "pass")
    assert good.name == "FWHT Triton vs copy d=768 bf16"
    assert "<= 1.5 x out.copy_(x)" in good.goal
    # 512 MiB moved (256 MiB read, 256 written) in 200 us: 2684 GB/s
    assert "copy 200 us (2684 GB/s) = 1.20x the copy" in good.measured
    assert "Triton 240 us (2237 GB/s)" in good.measured


def test_exactness_is_bounded_by_one_bf16_rounding() -> None:
    ok = Exactness("Triton", 8192, (1.6e-3, 1.6e-3), (2e-4, 1e-5))
    assert fwht.exact_check(768, ok, "H100").status == "pass"
    bad = {
        "off the fp64 reference": Exactness("Triton", 8192, (1.6e-3, 2.0**-7), (2e-4, 1e-5)),
        "many elements off the torch path": Exactness("Triton", 8192, (1.6e-3,) * 2, (0.3, 2e-3)),
        "far off the torch path": Exactness("Triton", 8192, (1.6e-3,) * 2, (2e-4, 2.0**-6)),
    }
    for why, m in bad.items():
        assert fwht.exact_check(768, m, "H100").status == "fail", why
    assert fwht.FP64_TOL == 2.0**-8  # bf16's unit roundoff: 8 significant bits
    row = fwht.exact_check(768, ok, "H100")
    assert row.name == "FWHT exact d=768 bf16"
    assert "Triton vs fp64: forward 1.60e-03" in row.measured
    assert "0.020% of elements differ, norm-relative 1.00e-05" in row.measured


def test_the_torch_path_alone_is_judged_against_fp64_and_says_triton_did_not_run() -> None:
    good = fwht.exact_check(768, Exactness("torch path", 64, (1.6e-3, 1.6e-3)), "CPU")
    bad = fwht.exact_check(768, Exactness("torch path", 64, (1.6e-3, 5e-3)), "CPU")
    assert (good.status, bad.status) == ("pass", "fail")
    assert f"Triton vs the torch path: {NO_GPU}" in good.measured


def test_the_fwht_parts_cpu_path_skips_the_speed_rows_and_passes_exactness(tmp_path) -> None:
    checks = fwht.run(True, tmp_path)
    names = [c.name for c in checks]
    assert len(set(names)) == len(names)
    speed = [c for c in checks if c.name.startswith("FWHT Triton vs copy")]
    assert [c.name for c in speed] == [fwht.speed_name(d) for d in fwht.LADDER_WIDTHS]
    assert all(c.status == "skipped" and c.measured.startswith(NO_GPU) for c in speed)
    assert all("the CPU's torch path took" in c.measured for c in speed)  # what it did measure
    (exact,) = [c for c in checks if c not in speed]
    assert (exact.name, exact.status) == ("FWHT exact d=768 bf16", "pass")
    assert exact.measured.startswith("torch path vs fp64")
    assert {c.status for c in checks} <= {"pass", "skipped"}


def test_gpu_tests_pass_only_when_every_test_ran_and_passed() -> None:
    def status(counts: Outcomes, returncode: int | None = 0) -> str:
        return gpu_tests.gpu_tests_check(counts, returncode, 42.0, "== 42 passed ==").status

    assert status(Outcomes(passed=42)) == "pass"
    assert status(Outcomes(passed=41, failed=1), returncode=1) == "fail"
    assert status(Outcomes(passed=0, skipped=42)) == "fail"  # no CUDA device: nothing ran
    assert status(Outcomes(passed=40, skipped=2)) == "fail"
    assert status(Outcomes(passed=30), returncode=None) == "fail"  # ran past its timeout
    assert status(Outcomes()) == "fail"
    row = gpu_tests.gpu_tests_check(Outcomes(passed=30), None, 80.4, "tests/x.py::t PASSED")
    assert row.measured.startswith("30 passed, 0 failed, 0 skipped in 80 s (ran past the")


def test_gpu_test_outcomes_are_counted_once_from_pytest_verbose_output() -> None:
    output = "\n".join([
        "tests/kernels/test_triton_gpu.py::test_a[dtype0-768] PASSED                  [ 25%]",
        "tests/kernels/test_triton_gpu.py::test_a[dtype1-768] FAILED                  [ 50%]",
        "tests/kernels/test_triton_gpu.py::test_b[768] ERROR                          [ 75%]",
        "tests/kernels/test_triton_gpu.py::test_b[1024] SKIPPED (needs a CUDA device) [100%]",
        "=========================== short test summary info ============================",
        "SKIPPED [1] tests/kernels/test_triton_gpu.py:75: needs a CUDA device",
        "FAILED tests/kernels/test_triton_gpu.py::test_a[dtype1-768] - AssertionError",
        "ERROR tests/kernels/test_triton_gpu.py::test_b[768] - RuntimeError",
    ])  # fmt: skip
    assert gpu_tests.count(output) == Outcomes(passed=1, failed=2, skipped=1)


def test_the_gpu_tests_collected_are_those_at_the_parts_widths() -> None:
    env = {**os.environ, gpu_tests.WIDTHS_VARIABLE: ",".join(map(str, gpu_tests.WIDTHS))}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "gpu", "-p",
         "no:cacheprovider", "tests/kernels/test_triton_gpu.py"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    ids = [line for line in proc.stdout.splitlines() if "::" in line]
    widths = {int(w) for line in ids for w in re.findall(r"[\[-](\d+)\]", line)}
    assert widths == set(gpu_tests.WIDTHS)
    assert len(ids) < 60  # every supported width would be ~170


def test_the_gpu_tests_parts_cpu_path_is_skipped_saying_no_gpu(tmp_path) -> None:
    (check,) = gpu_tests.run(True, tmp_path)
    assert (check.name, check.status) == ("GPU tests", "skipped")
    assert check.measured.startswith(NO_GPU)
