"""`python -m benchmarks.acceptance [--cpu] [--out DIR]` (scripts/gpu-acceptance.sh): every
check in turn, then acceptance.json and acceptance.md in DIR. Exit code 0 when nothing
failed, 1 otherwise, 2 on bad arguments or without a GPU (and without --cpu)."""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import traceback
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from benchmarks.acceptance.checks import Check


def guarded(part: str, checks: Callable[[], list[Check]]) -> list[Check]:
    """A part's checks; one that raises becomes a failed check naming the error, so the
    other parts still run and the summary is still written."""
    try:
        return checks()
    except Exception as e:
        traceback.print_exc()
        return [Check(part, "runs to the end", "fail", f"{type(e).__name__}: {e}"[:500])]


def run_checks(cpu: bool, out: Path) -> list[Check]:
    from benchmarks.acceptance import (
        blocks,
        compile_speed,
        data_parallel,
        gpu_tests,
        inference,
        loss,
        training,
    )

    parts: list[tuple[str, Callable[[], list[Check]]]] = [
        ("GPU tests", lambda: gpu_tests.run(cpu)),
        ("loss bf16 vs fp32", lambda: loss.run(cpu, out)),
        ("Hadamard vs dense blocks", lambda: blocks.run(cpu)),
        ("training steps and checkpoint", lambda: training.run(cpu, out)),
        ("training on every GPU", lambda: data_parallel.run(cpu, out)),
        ("TSA and BudgetFormer inference", lambda: inference.run(cpu)),
        ("torch.compile vs eager", lambda: compile_speed.run(cpu)),
    ]
    # Everything imported so far lives to the end: DeepSpeed's engine set-up calls
    # gc.collect() several times per engine, ~0.8 s each over MLflow's and DeepSpeed's
    # objects on a small CPU; frozen objects are not scanned.
    gc.freeze()
    return [c for name, part in parts for c in guarded(name, part)]


def markdown(checks: list[Check], mode: str) -> str:
    lines = [f"# GPU acceptance ({mode})", "", "| check | goal | status | measured |",
             "|---|---|---|---|"]  # fmt: skip
    for c in checks:
        cells = (text.replace("|", "\\|") for text in (c.name, c.goal, c.status, c.measured))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="scalelab's GPU acceptance check")
    parser.add_argument("--cpu", action="store_true", help="the CPU-sized path (CI)")
    parser.add_argument("--out", type=Path, default=Path("acceptance"), help="summary folder")
    args = parser.parse_args(argv)
    if (
        args.cpu
    ):  # the CPU path on a GPU machine stays on the CPU (jobs.training.distributed picks CUDA)
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    import torch

    if not args.cpu and not torch.cuda.is_available():
        print("gpu-acceptance: no CUDA device here; use --cpu for the CPU path", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    mode = "cpu" if args.cpu else "gpu"
    checks = run_checks(args.cpu, args.out.resolve())
    (args.out / "acceptance.json").write_text(
        json.dumps({"mode": mode, "checks": [asdict(c) for c in checks]}, indent=2)
    )
    (args.out / "acceptance.md").write_text(markdown(checks, mode))
    print(markdown(checks, mode))
    return 1 if any(c.status == "fail" for c in checks) else 0


if __name__ == "__main__":
    sys.exit(main())
