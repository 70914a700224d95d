"""One acceptance part in a process of its own (the runner, __main__.py, starts it):

    python -m benchmarks.acceptance.part NAME --out DIR --result FILE [--cpu]

It writes the part's checks to FILE as JSON. A module the part needs that this Python
lacks, or any error, becomes one failed check naming it: the other parts still run.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import os
import traceback
from dataclasses import asdict
from pathlib import Path

from benchmarks.acceptance.checks import Check
from benchmarks.acceptance.parts import BY_NAME

PROJECT = ("scalelab", "benchmarks")  # a module of the project missing is no install's fault
KIT_HINT = "build the wheel kit with scripts/gpu-kit.sh where the package index is reachable"


def failure(part: str, e: BaseException) -> Check:
    if isinstance(e, ModuleNotFoundError) and not str(e.name).startswith(PROJECT):
        return Check(part, "its imports are installed", "fail",
                     f"module {e.name!r} is not installed for this Python ({KIT_HINT})")  # fmt: skip
    return Check(part, "runs to the end", "fail", f"{type(e).__name__}: {e}"[:500])


def run_part(name: str, cpu: bool, out: Path) -> list[Check]:
    part = BY_NAME[name]
    if cpu:  # the CPU path stays on the CPU (jobs.training.distributed picks CUDA if it can)
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    try:
        module = importlib.import_module(f"benchmarks.acceptance.{part.module}")
        out.mkdir(parents=True, exist_ok=True)
        # What is imported now lives to the end: DeepSpeed's engine set-up calls gc.collect()
        # several times per engine, ~0.8 s each over MLflow's and DeepSpeed's objects on a
        # small CPU; frozen objects are not scanned.
        gc.freeze()
        return module.run(cpu, out)
    except Exception as e:
        traceback.print_exc()
        return [failure(name, e)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name", choices=sorted(BY_NAME))
    parser.add_argument("--cpu", action="store_true")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--result", type=Path, required=True)
    args = parser.parse_args(argv)
    checks = run_part(args.name, args.cpu, args.out)
    tmp = args.result.with_suffix(".tmp")
    tmp.write_text(json.dumps([asdict(c) for c in checks], indent=2))
    tmp.replace(args.result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
