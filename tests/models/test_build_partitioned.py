"""build_partitioned (ZeRO-3 construction under deepspeed.zero.Init) on 2 real gloo ranks:
every variant's parameters, gathered, equal the plain fp32 build's in bf16 bit for bit (and
in fp32, for the dense model), the RNG advances alike, and each rank holds half of the
model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from forked_ranks import on_ranks

from scalelab.models import catalog

WORKER = Path(__file__).with_name("partitioned_worker.py")
CONFIGS = {v: catalog.variant_fields(v) for v in catalog.variants()} | {
    "classify": {"task": "classify", "n_classes": 3},
    "mup": {"parametrization": "mup", "mup_base_width": 32, **catalog.variant_fields("hadamard")},
}
CASES = {f"{name}/bf16": (fields, "bf16") for name, fields in CONFIGS.items()} | {
    "dense/fp32": ({}, "fp32")  # bf16 would hide a difference in the low bits
}


@pytest.mark.slow
def test_partitioned_build_equals_the_fp32_build_on_two_ranks(tmp_path) -> None:
    out = tmp_path / "report.json"
    on_ranks(WORKER, "compare", str(out), CASES, timeout_s=300)
    report = json.loads(out.read_text())
    assert report.keys() == CASES.keys()
    for name, r in report.items():
        assert r["keys_match"] and r["differ"] == [], (name, r["differ"])
        assert r["same_rng"], f"{name}: the same draws were made"
        assert r["tied"] and r["rows"] == 320, name  # tied, vocabulary padded to 64 x 5
        assert r["whole"] / 2 <= r["held"] < r["whole"] / 2 + 64, name  # half, plus rounding
