"""The Triton kernel, run by Triton's CPU interpreter, gives the torch path's numbers."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# One subprocess (fresh interpreter-mode Triton) runs every check: ~9-12 s on a busy machine.
pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).with_name("triton_interpreter_check.py")


@pytest.fixture(scope="module")
def parity() -> dict[str, float]:
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, str(SCRIPT)], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_every_size_family_and_dtype_was_checked(parity):
    for key in (
        "2/float32",
        "12/float32",
        "1792/float32",
        "2560/float32",
        "32768/float32",
        "768/bfloat16",
        "1024/float16",
    ):
        assert f"forward {key}" in parity and f"backward {key}" in parity
    assert any(k.startswith("affine grad alpha") for k in parity)


def test_triton_forward_and_backward_match_torch(parity):
    # fp32: both paths sum the same +-1 terms in fp32, so they agree to fp32 rounding.
    # bf16/fp16: both round the same fp32 sums to the output dtype; Triton's interpreter
    # rounds fp32 -> bf16 toward zero (a compiled kernel rounds to nearest), so about half
    # the bf16 entries differ by one ulp: a norm-relative error below the dtype's eps.
    eps = {"float32": 1e-5, "bfloat16": 2.0**-7, "float16": 2.0**-10}
    bad = {}
    for name, err in parity.items():
        if name.startswith("auto"):
            continue
        if name.startswith("dtype"):
            if err:
                bad[name] = "output dtype differs from input"
            continue
        tol = eps[name.rsplit("/", 1)[1]]
        if not err < tol:
            bad[name] = err
    assert not bad, bad


def test_auto_keeps_the_real_kernel_after_its_self_check(parity):
    # fp32, bf16 and fp16 at d = 768, each in its three forms (affine, its two gradients)
    assert parity["auto on triton"] == 3 and parity["auto fallbacks"] == 0
